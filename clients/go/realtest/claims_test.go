package realtest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"nri-accel/clients/go/claims"
	"nri-accel/clients/go/claimsv1"
)

// driver is the DRA driver name nri-accel serves by default (dra.driver_name).
const driver = "accel.nri.io"

// whole is the DRA allocation result of one device of pool whole (published as whole-<id>).
func whole(id string) []claims.Result {
	return []claims.Result{{Request: "gpu", Driver: driver, Pool: "whole", Device: "whole-" + id}}
}

func prepareOne(t *testing.T, c *claims.Client, cl *claimsv1.Claim) claims.PrepareResult {
	t.Helper()
	res, err := c.Prepare(ctx(t), []*claimsv1.Claim{cl})
	if err != nil {
		t.Fatalf("Prepare of claim %s failed as a whole: %v", cl.GetUid(), err)
	}
	if len(res) != 1 {
		t.Fatalf("Prepare of claim %s answered %d entries, want 1: %v", cl.GetUid(), len(res), res)
	}
	return res[cl.GetUid()]
}

// TestPrepareListStatusUnprepare: the typed results of the four methods on a claim's life.
func TestPrepareListStatusUnprepare(t *testing.T) {
	n := newNode(t)
	n.start()
	c := claims.New(n.claims)
	defer c.Close()

	r := prepareOne(t, c, claims.FromAllocation("ns", "train", "uid-a", whole("gpu0")))
	if r.Err != nil {
		t.Fatalf("claim uid-a was refused: %v", r.Err)
	}
	if len(r.Devices) != 1 {
		t.Fatalf("claim uid-a got %d devices, want 1: %v", len(r.Devices), r.Devices)
	}
	d := r.Devices[0]
	if d.GetPoolName() != "whole" || d.GetDeviceName() != "whole-gpu0" || len(d.GetRequestNames()) != 1 || d.GetRequestNames()[0] != "gpu" {
		t.Fatalf("claim uid-a got device %v; want request gpu, pool whole, device whole-gpu0", d)
	}
	if len(d.GetCdiDeviceIds()) == 0 || !strings.HasPrefix(d.GetCdiDeviceIds()[0], "accel.nri.io/device=") {
		t.Fatalf("claim uid-a's device has CDI ids %v; want accel.nri.io/device=...", d.GetCdiDeviceIds())
	}
	if specs := n.cdiSpecs(); len(specs) != 1 {
		t.Fatalf("CDI dir holds %v after one Prepare; want one spec", specs)
	}

	// A count claim: the policy chooses the device, the other one of pool whole.
	r = prepareOne(t, c, claims.FromCount("ns", "eval", "uid-b", &claimsv1.CountRequest{
		Request: "any", Count: 1, Family: claimsv1.Family_FAMILY_EXCLUSIVE, Selector: &claimsv1.Selector{Vendor: "acme"},
	}))
	if r.Err != nil || len(r.Devices) != 1 || r.Devices[0].GetDeviceName() != "whole-gpu1" {
		t.Fatalf("count claim uid-b answered %v, %v; want whole-gpu1", r.Devices, r.Err)
	}

	list, err := c.List(ctx(t))
	must(t, err)
	held := map[string]*claimsv1.ClaimInfo{}
	for _, ci := range list {
		held[ci.GetUid()] = ci
	}
	a := held["uid-a"]
	if len(list) != 2 || a == nil || held["uid-b"] == nil {
		t.Fatalf("List answered %v; want uid-a and uid-b", list)
	}
	if a.GetNamespace() != "ns" || a.GetName() != "train" || a.GetState() != claimsv1.ClaimState_CLAIM_STATE_PREPARED ||
		len(a.GetDevices()) != 1 || !proto.Equal(a.GetDevices()[0], d) {
		t.Fatalf("List has uid-a as %v; want ns/train, prepared, with the device Prepare answered (%v)", a, d)
	}

	st, err := c.Status(ctx(t))
	must(t, err)
	if !st.GateOpen || len(st.Claims) != 2 || len(st.JSON) == 0 {
		t.Fatalf("Status answered gate %v, claims %v; want the gate open and two claims", st.GateOpen, st.Claims)
	}
	var gpu0Holder string
	for _, p := range st.Pools {
		for _, dev := range p.Devices {
			if p.Name == "whole" && dev.ID == "gpu0" && dev.UnitsUsed == 1 && len(dev.Held) == 1 {
				gpu0Holder = dev.Held[0].Claim
			}
		}
	}
	if gpu0Holder != "uid-a" {
		t.Fatalf("Status pools %+v do not show gpu0 of pool whole held by uid-a", st.Pools)
	}

	errs, err := c.Unprepare(ctx(t), []*claimsv1.ClaimRef{claims.Ref("ns", "train", "uid-a"), claims.Ref("ns", "eval", "uid-b")})
	must(t, err)
	if len(errs) != 2 || errs["uid-a"] != nil || errs["uid-b"] != nil {
		t.Fatalf("Unprepare answered %v; want nil for uid-a and uid-b", errs)
	}
	list, err = c.List(ctx(t))
	must(t, err)
	if len(list) != 0 {
		t.Fatalf("List after Unprepare answered %v; want nothing held", list)
	}
	if specs := n.cdiSpecs(); len(specs) != 0 {
		t.Fatalf("CDI dir still holds %v after Unprepare", specs)
	}
}

// TestRefusalNamesTheHolder: a second claim for a held device is refused, alone, as a
// RefusalError naming the device and the holder; a count claim's refusal names holders too.
func TestRefusalNamesTheHolder(t *testing.T) {
	n := newNode(t)
	n.start()
	c := claims.New(n.claims)
	defer c.Close()

	if r := prepareOne(t, c, claims.FromAllocation("ns", "first", "holder-1", whole("gpu0"))); r.Err != nil {
		t.Fatalf("claim holder-1 was refused: %v", r.Err)
	}
	res, err := c.Prepare(ctx(t), []*claimsv1.Claim{
		claims.FromAllocation("other", "second", "wants-gpu0", whole("gpu0")),
		claims.FromAllocation("other", "third", "wants-gpu1", whole("gpu1")),
	})
	must(t, err)
	if res["wants-gpu1"].Err != nil || len(res["wants-gpu1"].Devices) != 1 {
		t.Fatalf("sibling claim wants-gpu1 answered %v; a refused sibling must not fail it", res["wants-gpu1"])
	}
	r := res["wants-gpu0"]
	if len(r.Devices) != 0 {
		t.Fatalf("refused claim wants-gpu0 got devices %v", r.Devices)
	}
	re, ok := claims.AsRefusal(r.Err)
	if !ok {
		t.Fatalf("claim wants-gpu0 answered %v (%T); want a *claims.RefusalError", r.Err, r.Err)
	}
	holder, device, ok := re.Holder()
	if re.UID != "wants-gpu0" || !ok || holder != "holder-1" || device != "gpu0" {
		t.Fatalf("refusal %+v; want claim wants-gpu0, device gpu0 held by holder-1", re)
	}
	if !strings.HasPrefix(re.Message, "claim wants-gpu0 refused: ") || !strings.HasPrefix(re.Reason, "device gpu0 is held by claim holder-1") {
		t.Fatalf("refusal message %q, reason %q; want the daemon's sentence and its reason", re.Message, re.Reason)
	}

	// Both devices of pool whole are held now: a count claim for one is refused with each
	// device's holder and its namespace/name.
	r = prepareOne(t, c, claims.FromCount("ns", "counting", "count-1", &claimsv1.CountRequest{
		Request: "gpu", Count: 1, Family: claimsv1.Family_FAMILY_EXCLUSIVE,
	}))
	re, ok = claims.AsRefusal(r.Err)
	if !ok {
		t.Fatalf("count claim count-1 answered %v, %v; want a refusal", r.Devices, r.Err)
	}
	want := []claims.Holding{
		{Device: "gpu0", Claim: "holder-1", Namespace: "ns", Name: "first"},
		{Device: "gpu1", Claim: "wants-gpu1", Namespace: "other", Name: "third"},
	}
	if len(re.Holders) != len(want) || re.Holders[0] != want[0] || re.Holders[1] != want[1] {
		t.Fatalf("count refusal %q parsed as holders %+v; want %+v", re.Message, re.Holders, want)
	}
}

// TestInvalidClaimIsItsOwnError: malformed claims get their own error in the answer, keyed by the
// UID as sent; the valid sibling is granted.
func TestInvalidClaimIsItsOwnError(t *testing.T) {
	n := newNode(t)
	n.start()
	c := claims.New(n.claims)
	defer c.Close()

	res, err := c.Prepare(ctx(t), []*claimsv1.Claim{
		claims.FromAllocation("ns", "bad", "not/a/uid", whole("gpu0")),
		claims.FromAllocation("ns", "empty", "asks-nothing", nil),
		claims.FromAllocation("ns", "fine", "valid-1", whole("gpu1")),
	})
	must(t, err)
	if len(res) != 3 {
		t.Fatalf("Prepare answered %d entries for 3 claims: %v", len(res), res)
	}
	if r := res["valid-1"]; r.Err != nil || len(r.Devices) != 1 {
		t.Fatalf("valid claim valid-1 answered %v, %v; want granted", r.Devices, r.Err)
	}
	for _, uid := range []string{"not/a/uid", "asks-nothing"} {
		re, ok := claims.AsRefusal(res[uid].Err)
		if !ok || re.UID != uid || len(res[uid].Devices) != 0 || len(re.Holders) != 0 || !strings.Contains(re.Message, uid) {
			t.Fatalf("claim %q answered %v, %v; want its own RefusalError naming it, no devices", uid, res[uid].Devices, res[uid].Err)
		}
	}
	list, err := c.List(ctx(t))
	must(t, err)
	if len(list) != 1 || list[0].GetUid() != "valid-1" {
		t.Fatalf("List answered %v; want only valid-1 held", list)
	}
}

// TestDeadlineAndRetryAnsweredIdempotently: a call to a daemon that does not answer (stopped
// with SIGSTOP) ends with DEADLINE_EXCEEDED at the caller's deadline or the client's call
// timeout, and the same claim prepared again once it runs answers one grant, the same each time.
func TestDeadlineAndRetryAnsweredIdempotently(t *testing.T) {
	n := newNode(t)
	n.start()
	c := claims.New(n.claims)
	defer c.Close()
	short := claims.New(n.claims, claims.WithCallTimeout(200*time.Millisecond))
	defer short.Close()
	// Connect both before the daemon stops: the kernel would still accept a new connection, but
	// this keeps the test about the call, not the dial.
	_, err := c.List(ctx(t))
	must(t, err)
	_, err = short.List(ctx(t))
	must(t, err)

	must(t, n.daemon.Process.Signal(syscall.SIGSTOP))
	stopped := true
	defer func() {
		if stopped {
			n.daemon.Process.Signal(syscall.SIGCONT)
		}
	}()
	claim := claims.FromAllocation("ns", "slow", "slow-1", whole("gpu0"))
	dctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	_, err = c.Prepare(dctx, []*claimsv1.Claim{claim})
	cancel()
	var ce *claims.CallError
	if !errors.As(err, &ce) || ce.Code != claims.DeadlineExceeded || !errors.Is(err, context.DeadlineExceeded) || !claims.Retryable(err) {
		t.Fatalf("Prepare past the caller's deadline answered %v; want a retryable DEADLINE_EXCEEDED CallError", err)
	}
	_, err = short.Status(context.Background())
	if claims.CodeOf(err) != claims.DeadlineExceeded {
		t.Fatalf("Status past WithCallTimeout answered %v; want DEADLINE_EXCEEDED", err)
	}
	must(t, n.daemon.Process.Signal(syscall.SIGCONT))
	stopped = false

	first := prepareOne(t, c, claim)
	again := prepareOne(t, c, claim)
	if first.Err != nil || again.Err != nil || len(first.Devices) != 1 || len(again.Devices) != 1 || !proto.Equal(first.Devices[0], again.Devices[0]) {
		t.Fatalf("the claim prepared twice answered %v / %v and %v / %v; want the same grant twice", first.Devices, first.Err, again.Devices, again.Err)
	}
	list, err := c.List(ctx(t))
	must(t, err)
	if len(list) != 1 || list[0].GetUid() != "slow-1" {
		t.Fatalf("List answered %v; want slow-1 held once", list)
	}
	// Unprepare is idempotent too: an unknown claim is success.
	for i := 0; i < 2; i++ {
		errs, err := c.Unprepare(ctx(t), []*claimsv1.ClaimRef{claims.Ref("ns", "slow", "slow-1")})
		must(t, err)
		if errs["slow-1"] != nil {
			t.Fatalf("Unprepare #%d of slow-1 answered %v; want success", i+1, errs["slow-1"])
		}
	}
}

// TestReconnectAfterKill9: the same client keeps working across kill -9 and a restart of the
// daemon: UNAVAILABLE while it is down, the claim it held is still held after the restart, and
// new calls are served on a new connection.
func TestReconnectAfterKill9(t *testing.T) {
	n := newNode(t)
	n.start()
	c := claims.New(n.claims)
	defer c.Close()

	before := prepareOne(t, c, claims.FromAllocation("ns", "keep", "kept-1", whole("gpu0")))
	if before.Err != nil {
		t.Fatalf("claim kept-1 was refused: %v", before.Err)
	}
	n.kill9()
	_, err := c.List(ctx(t))
	if !claims.IsUnavailable(err) || !claims.Retryable(err) {
		t.Fatalf("List with the daemon killed answered %v; want a retryable UNAVAILABLE", err)
	}

	n.start()
	list, err := c.List(ctx(t))
	must(t, err)
	if len(list) != 1 || list[0].GetUid() != "kept-1" || !proto.Equal(list[0].GetDevices()[0], before.Devices[0]) {
		t.Fatalf("List after the restart answered %v; want kept-1 with %v", list, before.Devices)
	}
	again := prepareOne(t, c, claims.FromAllocation("ns", "keep", "kept-1", whole("gpu0")))
	if again.Err != nil || !proto.Equal(again.Devices[0], before.Devices[0]) {
		t.Fatalf("kept-1 prepared again after the restart answered %v, %v; want the grant it had (%v)", again.Devices, again.Err, before.Devices)
	}
	r := prepareOne(t, c, claims.FromAllocation("ns", "new", "after-1", whole("gpu0")))
	if holder, _, ok := func() (string, string, bool) {
		re, ok := claims.AsRefusal(r.Err)
		if !ok {
			return "", "", false
		}
		return re.Holder()
	}(); !ok || holder != "kept-1" {
		t.Fatalf("a second claim for gpu0 after the restart answered %v, %v; want refused, held by kept-1", r.Devices, r.Err)
	}
}

// TestGateClosedIsUnavailable: while the container runtime is away the gate is closed: Prepare
// and Unprepare are refused whole with UNAVAILABLE (retry shortly), List and Status are served;
// when the runtime is back and synchronizes, the same client's retry is served.
func TestGateClosedIsUnavailable(t *testing.T) {
	n := newNode(t)
	n.start()
	c := claims.New(n.claims)
	defer c.Close()

	n.stopRuntime()
	// Until the daemon sees the connection gone, Prepare is answered per claim (granted, or
	// refused because the connection was lost while it ran); sending it again is safe, it is
	// idempotent.
	var err error
	deadline := time.Now().Add(wait)
	for {
		_, err = c.Prepare(ctx(t), []*claimsv1.Claim{claims.FromAllocation("ns", "gated", "gated-1", whole("gpu0"))})
		if err != nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	var ce *claims.CallError
	if !errors.As(err, &ce) || ce.Code != claims.Unavailable || !claims.Retryable(err) || !strings.Contains(ce.Message, "retry shortly") {
		t.Fatalf("Prepare with the runtime gone answered %v; want UNAVAILABLE, retry shortly", err)
	}
	if _, err := c.Unprepare(ctx(t), []*claimsv1.ClaimRef{claims.Ref("ns", "gated", "gated-1")}); !claims.IsUnavailable(err) {
		t.Fatalf("Unprepare with the gate closed answered %v; want UNAVAILABLE", err)
	}
	st, err := c.Status(ctx(t))
	must(t, err)
	if st.GateOpen {
		t.Fatal("Status says the gate is open with the runtime gone")
	}

	n.startRuntime()
	n.waitGate()
	r := prepareOne(t, c, claims.FromAllocation("ns", "gated", "gated-1", whole("gpu0")))
	if r.Err != nil {
		t.Fatalf("Prepare after the runtime came back answered %v", r.Err)
	}
}

// TestEvictedConnectionIsRedialed: with one connection allowed, each client's connection is
// closed by the daemon to admit the other's; each client's next call reconnects (redialing, or
// sending the call again when the close came under it) and is served. No call is refused with
// RESOURCE_EXHAUSTED: the other client's connection may still be counted busy for an instant
// after its answer was read, and the daemon waits for it (up to 100 ms) instead of refusing
// (before it did, 5 to 7 of these 17 calls were refused on a loaded machine).
func TestEvictedConnectionIsRedialed(t *testing.T) {
	n := newNodeWith(t, "  max_connections: 1\n")
	n.start()
	a := claims.New(n.claims)
	defer a.Close()
	b := claims.New(n.claims)
	defer b.Close()
	served := func(what string, call func() error) {
		t.Helper()
		deadline := time.Now().Add(wait)
		for {
			err := call()
			if err == nil {
				return
			}
			if !claims.Retryable(err) || time.Now().After(deadline) {
				t.Fatalf("%s answered %v", what, err)
			}
			if claims.CodeOf(err) == claims.ResourceExhausted {
				t.Errorf("%s was refused although the other connection's call was answered: %v", what, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	served("a's first List", func() error { _, err := a.List(ctx(t)); return err })
	served("b's first List", func() error { _, err := b.List(ctx(t)); return err })
	for i := 0; i < 5; i++ {
		uid := fmt.Sprintf("evict-%d", i)
		served(fmt.Sprintf("round %d: a's Prepare", i), func() error {
			res, err := a.Prepare(ctx(t), []*claimsv1.Claim{claims.FromAllocation("ns", uid, uid, whole("gpu0"))})
			if err == nil && res[uid].Err != nil {
				t.Fatalf("round %d: claim %s refused: %v", i, uid, res[uid].Err)
			}
			return err
		})
		served(fmt.Sprintf("round %d: b's List", i), func() error {
			list, err := b.List(ctx(t))
			if err == nil && (len(list) != 1 || list[0].GetUid() != uid) {
				t.Fatalf("round %d: List answered %v; want %s", i, list, uid)
			}
			return err
		})
		served(fmt.Sprintf("round %d: a's Unprepare", i), func() error {
			errs, err := a.Unprepare(ctx(t), []*claimsv1.ClaimRef{claims.Ref("ns", uid, uid)})
			if err == nil && errs[uid] != nil {
				t.Fatalf("round %d: Unprepare of %s answered %v", i, uid, errs[uid])
			}
			return err
		})
	}
}
