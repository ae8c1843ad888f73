package claims

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Code is a ttrpc (gRPC) status code; the claims API uses the ones below
// (docs/claims-api.md, "Whole-request refusals").
type Code = codes.Code

// The status codes the claims API answers a whole request with.
const (
	// Unavailable: the gate is closed (nri-accel waits for the container runtime's Synchronize)
	// or the daemon cannot be reached; retry shortly.
	Unavailable = codes.Unavailable
	// ResourceExhausted: the payload is over the message limit (send fewer claims), or every
	// connection the daemon serves has a call in flight (retry shortly).
	ResourceExhausted = codes.ResourceExhausted
	// InvalidArgument: more claims than one request may carry, or a payload that does not decode.
	InvalidArgument = codes.InvalidArgument
	// Internal: the claim engine failed as a whole; no claim was answered.
	Internal = codes.Internal
	// DeadlineExceeded: the call's deadline passed; the daemon still finishes the call, and a
	// retry is answered idempotently.
	DeadlineExceeded = codes.DeadlineExceeded
	// PermissionDenied: the caller's uid is not admitted (root, the daemon's uid, or a member of
	// claims_api.group).
	PermissionDenied = codes.PermissionDenied
	// Unimplemented: the daemon does not know the method (it is older than this client).
	Unimplemented = codes.Unimplemented
	// Canceled: the caller's context was canceled.
	Canceled = codes.Canceled
)

// CallError is a whole-request failure: the daemon answered the call with a ttrpc status
// instead of per-claim results, or the call never reached it. No claim was answered; retry the
// whole call when [Retryable] says so.
//
// It implements GRPCStatus, so a DRA driver that returns it from its kubelet handler hands the
// same code to the kubelet.
type CallError struct {
	// Method is the claims API method called: Prepare, Unprepare, List or Status.
	Method string
	// Code is the status code (Unavailable also for a daemon that cannot be reached).
	Code Code
	// Message is the daemon's message, or the client's sentence when the call never got an answer.
	Message string
	// Err is the underlying error (a ttrpc status, a dial error, a context error).
	Err error
}

// Error is one sentence naming the method, the code and the reason.
func (e *CallError) Error() string {
	return fmt.Sprintf("nri-accel claims API %s failed (%s): %s", e.Method, e.Code, e.Message)
}

// Unwrap returns the underlying error (a ttrpc status, a dial error, a context error).
func (e *CallError) Unwrap() error { return e.Err }

// Is makes errors.Is(err, context.DeadlineExceeded) hold for every DEADLINE_EXCEEDED, whether the
// client saw the deadline pass or the daemon answered it first, and errors.Is(err,
// context.Canceled) for a canceled call.
func (e *CallError) Is(target error) bool {
	switch target {
	case context.DeadlineExceeded:
		return e.Code == DeadlineExceeded
	case context.Canceled:
		return e.Code == Canceled
	}
	return false
}

// GRPCStatus is the error as a gRPC status with the same code and message.
func (e *CallError) GRPCStatus() *status.Status { return status.New(e.Code, e.Error()) }

// CodeOf answers the status code of a whole-request failure, codes.OK for nil, and codes.Unknown
// for any other error.
func CodeOf(err error) Code {
	if err == nil {
		return codes.OK
	}
	var ce *CallError
	if errors.As(err, &ce) {
		return ce.Code
	}
	return codes.Unknown
}

// IsUnavailable says whether err is a whole-request UNAVAILABLE: the gate is closed (the daemon
// starts, or the container runtime restarts) or the daemon cannot be reached. Retry shortly.
func IsUnavailable(err error) bool { return CodeOf(err) == Unavailable }

// Retryable says whether sending the same call again may succeed without changing it:
// UNAVAILABLE, DEADLINE_EXCEEDED, INTERNAL, and a RESOURCE_EXHAUSTED that refused the connection
// (every connection busy) rather than the payload's size. Prepare and Unprepare are idempotent,
// so such a retry is always safe. The other codes need the caller to change something.
func Retryable(err error) bool {
	var ce *CallError
	if !errors.As(err, &ce) {
		return false
	}
	switch ce.Code {
	case Unavailable, DeadlineExceeded, Internal:
		return true
	case ResourceExhausted:
		// Only the busy refusal says to retry; a payload over the daemon's limit or over ttrpc's
		// 4 MiB frame ("message length N exceed maximum message size") fails again as sent.
		return strings.Contains(ce.Message, "retry shortly")
	}
	return false
}

// callError turns what a ttrpc call returned into a [*CallError].
func callError(ctx context.Context, method string, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) {
		return contextError(method, ctxErr, err)
	}
	if s, ok := status.FromError(err); ok {
		return &CallError{Method: method, Code: s.Code(), Message: s.Message(), Err: err}
	}
	return &CallError{Method: method, Code: codes.Unknown, Message: err.Error(), Err: err}
}

// contextError is the [*CallError] of a call whose context ended before the answer came.
func contextError(method string, ctxErr, err error) error {
	code := DeadlineExceeded
	msg := "the call's deadline passed before nri-accel answered; nri-accel still finishes it, and a retry is answered idempotently"
	if errors.Is(ctxErr, context.Canceled) {
		code = Canceled
		msg = "the caller canceled the call before nri-accel answered; nri-accel still finishes it, and a retry is answered idempotently"
	}
	if err != nil && !errors.Is(err, ctxErr) {
		err = fmt.Errorf("%w (%v)", ctxErr, err)
	} else {
		err = ctxErr
	}
	return &CallError{Method: method, Code: code, Message: msg, Err: err}
}

// RefusalError is one claim's error in a Prepare or Unprepare answer: nri-accel refused that
// claim (Prepare granted it nothing; Unprepare released nothing) and the caller retries it
// once the cause is gone (docs/refusals.md lists the sentences).
type RefusalError struct {
	// UID is the claim's UID, the key of the answer.
	UID string
	// Message is the daemon's whole sentence, as sent.
	Message string
	// Reason is the sentence without its leading "claim <uid> refused: " (or "not prepared: ",
	// "not unprepared: ", "<uid>: "); the whole sentence when it has no such start.
	Reason string
	// Holders are the claims the sentence names as holding a device this claim needed, in the
	// order named ("device accel0 is held by claim X", or for a count request
	// "gpu0 is held by claim X (ns/name)"); empty when the refusal is about something else.
	Holders []Holding
}

// Holding is a device and a claim the daemon named as holding it.
type Holding struct {
	// Device is the device id as the daemon named it (e.g. accel0).
	Device string
	// Claim is the holder's claim UID (an adopted-... claim is a running container's).
	Claim string
	// Namespace and Name of the holder, when the sentence gives them.
	Namespace, Name string
}

// Error is the daemon's sentence.
func (e *RefusalError) Error() string { return e.Message }

// Holder is the first claim named as holding a device this claim needed, and that device; ok is
// false when the refusal names no holder.
func (e *RefusalError) Holder() (claim, device string, ok bool) {
	if len(e.Holders) == 0 {
		return "", "", false
	}
	return e.Holders[0].Claim, e.Holders[0].Device, true
}

// AsRefusal returns err as a [*RefusalError] when it is one.
func AsRefusal(err error) (*RefusalError, bool) {
	var re *RefusalError
	ok := errors.As(err, &re)
	return re, ok
}

// ErrNotAnswered is wrapped by the error of a claim the daemon's answer left out (the API
// promises every claim an entry; this guards against a daemon that breaks it).
var ErrNotAnswered = errors.New("nri-accel's answer has no entry for this claim")

func notAnswered(uid, method string) error {
	return fmt.Errorf("claim %s: %w; retry the %s", uid, ErrNotAnswered, method)
}

// A claim UID as the daemon accepts them: [A-Za-z0-9_.-], a letter or digit at both ends.
const uidPattern = `[A-Za-z0-9](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?`

var (
	// "<device> is held by claim A (ns/n), claim B and 2 more", optionally after "device ".
	heldRe = regexp.MustCompile(`(\S+) is held by ((?:claim ` + uidPattern + `(?: \([^()]*\))?(?:, )?)+)`)
	// One "claim A (ns/n)" of such a list.
	holderRe = regexp.MustCompile(`claim (` + uidPattern + `)(?: \(([^()/]*)/([^()]*)\))?`)
)

// newRefusal parses the daemon's sentence for claim uid. It never fails: what it cannot parse
// stays in Message and Reason.
func newRefusal(uid, msg string) *RefusalError {
	e := &RefusalError{UID: uid, Message: msg, Reason: msg}
	for _, start := range []string{"claim " + uid + " refused: ", "claim " + uid + " not prepared: ", "claim " + uid + " not unprepared: ", "claim " + uid + ": "} {
		if strings.HasPrefix(msg, start) {
			e.Reason = msg[len(start):]
			break
		}
	}
	for _, m := range heldRe.FindAllStringSubmatch(e.Reason, -1) {
		device := m[1]
		for _, h := range holderRe.FindAllStringSubmatch(m[2], -1) {
			e.Holders = append(e.Holders, Holding{Device: device, Claim: h[1], Namespace: h[2], Name: h[3]})
		}
	}
	return e
}
