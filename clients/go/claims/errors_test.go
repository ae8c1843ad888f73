package claims

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestRefusalParsing(t *testing.T) {
	cases := []struct {
		name    string
		uid     string
		msg     string
		reason  string
		holders []Holding
	}{
		{
			name:    "device held by a claim, with what its pool has free",
			uid:     "b",
			msg:     "claim b refused: device accel0 is held by claim a-1 until that claim is unprepared; free in pool whole: accel1",
			reason:  "device accel0 is held by claim a-1 until that claim is unprepared; free in pool whole: accel1",
			holders: []Holding{{Device: "accel0", Claim: "a-1"}},
		},
		{
			name:    "held by a running container without a record",
			uid:     "c",
			msg:     "claim c refused: device accel0 is held by claim adopted-3f2a9c1d0b7e-accel0 until that claim is unprepared; pool whole has no free device now",
			reason:  "device accel0 is held by claim adopted-3f2a9c1d0b7e-accel0 until that claim is unprepared; pool whole has no free device now",
			holders: []Holding{{Device: "accel0", Claim: "adopted-3f2a9c1d0b7e-accel0"}},
		},
		{
			name: "count request: every matching device with its holders",
			uid:  "u9",
			msg: "claim u9 refused: request gpu cannot be met by the devices free now: gpu0 is held by claim c1 (ns/train), " +
				"claim c2 (ns/eval) and 2 more; gpu1 is held by claim ctr-x (default/pod/main); no matching device is free",
			reason: "request gpu cannot be met by the devices free now: gpu0 is held by claim c1 (ns/train), " +
				"claim c2 (ns/eval) and 2 more; gpu1 is held by claim ctr-x (default/pod/main); no matching device is free",
			holders: []Holding{
				{Device: "gpu0", Claim: "c1", Namespace: "ns", Name: "train"},
				{Device: "gpu0", Claim: "c2", Namespace: "ns", Name: "eval"},
				{Device: "gpu1", Claim: "ctr-x", Namespace: "default", Name: "pod/main"},
			},
		},
		{
			name:   "a holder without a name, at the end of the sentence",
			uid:    "u",
			msg:    "claim u refused: request r cannot be met by the devices free now: gpu3 is held by claim x.y",
			reason: "request r cannot be met by the devices free now: gpu3 is held by claim x.y",
			holders: []Holding{
				{Device: "gpu3", Claim: "x.y"},
			},
		},
		{
			name:   "an invalid field",
			uid:    "u1",
			msg:    `claim u1: requests[0].request "a\u0000" is invalid: at most 253 characters, no control characters`,
			reason: `requests[0].request "a\u0000" is invalid: at most 253 characters, no control characters`,
		},
		{
			name:   "held under another namespace/name",
			uid:    "x",
			msg:    "claim x not prepared: it is held as a/n1 and this Prepare names it b/n2; nothing was changed",
			reason: "it is held as a/n1 and this Prepare names it b/n2; nothing was changed",
		},
		{
			name:   "in use by a container",
			uid:    "u1",
			msg:    "claim u1 not unprepared: it is in use by container(s) 3f2a9c1d0b7e (default/train/main); nothing was released",
			reason: "it is in use by container(s) 3f2a9c1d0b7e (default/train/main); nothing was released",
		},
		{
			name:   "a sentence of another shape is kept whole",
			uid:    "k",
			msg:    "claim k is already prepared with 1 exclusive unit and this Prepare asks for 2",
			reason: "claim k is already prepared with 1 exclusive unit and this Prepare asks for 2",
		},
		{
			name:   "an invalid UID, quoted",
			uid:    "not/a/uid",
			msg:    `claim uid "not/a/uid" is invalid: a uid is 1 to 128 characters of [A-Za-z0-9_.-], starts and ends with a letter or digit and contains no ".."`,
			reason: `claim uid "not/a/uid" is invalid: a uid is 1 to 128 characters of [A-Za-z0-9_.-], starts and ends with a letter or digit and contains no ".."`,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newRefusal(c.uid, c.msg)
			if e.UID != c.uid || e.Message != c.msg || e.Error() != c.msg || e.Reason != c.reason {
				t.Fatalf("parsed %+v; want uid %q, the message kept, reason %q", e, c.uid, c.reason)
			}
			if !reflect.DeepEqual(e.Holders, c.holders) {
				t.Fatalf("holders %+v; want %+v", e.Holders, c.holders)
			}
			claim, device, ok := e.Holder()
			if ok != (len(c.holders) > 0) || (ok && (claim != c.holders[0].Claim || device != c.holders[0].Device)) {
				t.Fatalf("Holder() = %q, %q, %v; want the first of %+v", claim, device, ok, c.holders)
			}
			wrapped := fmt.Errorf("forwarding: %w", e)
			if got, ok := AsRefusal(wrapped); !ok || got != e {
				t.Fatal("AsRefusal does not find the refusal through a wrap")
			}
		})
	}
}

func TestCodesAndRetryable(t *testing.T) {
	statusErr := func(c codes.Code, msg string) error {
		return callError(context.Background(), "Prepare", status.Error(c, msg))
	}
	cases := []struct {
		err         error
		code        codes.Code
		unavailable bool
		retryable   bool
	}{
		{nil, codes.OK, false, false},
		{errors.New("something else"), codes.Unknown, false, false},
		{statusErr(codes.Unavailable, "nri-accel is waiting for the container runtime's Synchronize; retry shortly"), codes.Unavailable, true, true},
		{statusErr(codes.DeadlineExceeded, "timeout"), codes.DeadlineExceeded, false, true},
		{statusErr(codes.Internal, "nri-accel's claim engine failed: panic; retry, and see the daemon's log"), codes.Internal, false, true},
		{statusErr(codes.ResourceExhausted, "nri-accel refused this connection: 128 connections are open and every one has a call in flight, the most it serves at once (claims_api.max_connections); retry shortly"), codes.ResourceExhausted, false, true},
		{statusErr(codes.ResourceExhausted, "Prepare request of 2000000 bytes exceeds the claims API limit of 1048576 bytes; send fewer claims per request"), codes.ResourceExhausted, false, false},
		{statusErr(codes.ResourceExhausted, "message length 5000000 exceed maximum message size of 4194304"), codes.ResourceExhausted, false, false},
		{statusErr(codes.InvalidArgument, "request carries 2000 claims, more than the limit of 1024; split it"), codes.InvalidArgument, false, false},
		{statusErr(codes.PermissionDenied, "uid 1000 (pid 4242) may not use the claims API"), codes.PermissionDenied, false, false},
		{statusErr(codes.Unimplemented, "Nope method"), codes.Unimplemented, false, false},
	}
	for _, c := range cases {
		if got := CodeOf(c.err); got != c.code {
			t.Errorf("CodeOf(%v) = %v; want %v", c.err, got, c.code)
		}
		if got := IsUnavailable(c.err); got != c.unavailable {
			t.Errorf("IsUnavailable(%v) = %v; want %v", c.err, got, c.unavailable)
		}
		if got := Retryable(c.err); got != c.retryable {
			t.Errorf("Retryable(%v) = %v; want %v", c.err, got, c.retryable)
		}
		if wrapped := fmt.Errorf("wrapped: %w", c.err); c.err != nil && CodeOf(wrapped) != c.code {
			t.Errorf("CodeOf does not see %v through a wrap", c.err)
		}
		var ce *CallError
		if errors.As(c.err, &ce) {
			if s, ok := status.FromError(c.err); !ok || s.Code() != c.code {
				t.Errorf("status.FromError(%v) = %v; want code %v (a driver hands it on to the kubelet)", c.err, s, c.code)
			}
		}
	}
}
