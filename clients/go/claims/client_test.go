package claims

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/ttrpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"nri-accel/clients/go/claimsv1"
)

// fakeService answers the claims API in-process; each test sets the methods it needs.
type fakeService struct {
	prepare   func(context.Context, *claimsv1.PrepareRequest) (*claimsv1.PrepareResponse, error)
	unprepare func(context.Context, *claimsv1.UnprepareRequest) (*claimsv1.UnprepareResponse, error)
	list      func(context.Context, *claimsv1.ListRequest) (*claimsv1.ListResponse, error)
	status    func(context.Context, *claimsv1.StatusRequest) (*claimsv1.StatusResponse, error)
}

func (f *fakeService) Prepare(ctx context.Context, r *claimsv1.PrepareRequest) (*claimsv1.PrepareResponse, error) {
	return f.prepare(ctx, r)
}

func (f *fakeService) Unprepare(ctx context.Context, r *claimsv1.UnprepareRequest) (*claimsv1.UnprepareResponse, error) {
	return f.unprepare(ctx, r)
}

func (f *fakeService) List(ctx context.Context, r *claimsv1.ListRequest) (*claimsv1.ListResponse, error) {
	return f.list(ctx, r)
}

func (f *fakeService) Status(ctx context.Context, r *claimsv1.StatusRequest) (*claimsv1.StatusResponse, error) {
	return f.status(ctx, r)
}

// chanListener hands ttrpc's server the connections a test lets through.
type chanListener struct {
	conns chan net.Conn
	addr  net.Addr
	once  sync.Once
	done  chan struct{}
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *chanListener) Close() error   { l.once.Do(func() { close(l.done) }); return nil }
func (l *chanListener) Addr() net.Addr { return l.addr }

// serve serves svc on a socket in a temp dir and returns its path. The first dropFirst
// connections are closed as soon as they sent something (a daemon that restarted, or closed the
// connection, after the request left).
func serve(t *testing.T, svc claimsv1.ClaimsService, dropFirst int) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "claims-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "claims.sock")
	raw, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := ttrpc.NewServer()
	if err != nil {
		t.Fatal(err)
	}
	claimsv1.RegisterClaimsService(srv, svc)
	l := &chanListener{conns: make(chan net.Conn), addr: raw.Addr(), done: make(chan struct{})}
	go func() {
		for i := 0; ; i++ {
			c, err := raw.Accept()
			if err != nil {
				return
			}
			if i < dropFirst {
				go func() {
					buf := make([]byte, 1)
					c.Read(buf)
					c.Close()
				}()
				continue
			}
			select {
			case l.conns <- c:
			case <-l.done:
				c.Close()
				return
			}
		}
	}()
	go srv.Serve(context.Background(), l)
	t.Cleanup(func() {
		raw.Close()
		srv.Close()
	})
	return sock
}

func granted(uid string) *claimsv1.PrepareResult {
	return &claimsv1.PrepareResult{Devices: []*claimsv1.Device{{
		RequestNames: []string{"gpu"}, PoolName: "whole", DeviceName: "whole-gpu0",
		CdiDeviceIds: []string{"accel.nri.io/device=claim-" + uid + "-0"},
	}}}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// A request whose connection closes before the answer is sent again, once, on a new connection:
// Prepare is idempotent.
func TestBrokenConnectionIsRedialedAndTheCallSentAgain(t *testing.T) {
	var calls atomic.Int32
	svc := &fakeService{prepare: func(_ context.Context, r *claimsv1.PrepareRequest) (*claimsv1.PrepareResponse, error) {
		calls.Add(1)
		return &claimsv1.PrepareResponse{Claims: map[string]*claimsv1.PrepareResult{"u1": granted("u1")}}, nil
	}}
	c := New(serve(t, svc, 1))
	defer c.Close()
	res, err := c.Prepare(testCtx(t), []*claimsv1.Claim{FromAllocation("ns", "n", "u1", nil)})
	if err != nil {
		t.Fatalf("Prepare over a connection closed under it answered %v; want it sent again and answered", err)
	}
	if res["u1"].Err != nil || !proto.Equal(res["u1"].Devices[0], granted("u1").Devices[0]) || calls.Load() != 1 {
		t.Fatalf("answered %v after %d calls reached the service; want the grant, one call", res, calls.Load())
	}
}

// Only once: a connection that breaks again is the caller's UNAVAILABLE to retry.
func TestBrokenTwiceIsUnavailable(t *testing.T) {
	svc := &fakeService{list: func(context.Context, *claimsv1.ListRequest) (*claimsv1.ListResponse, error) {
		return &claimsv1.ListResponse{}, nil
	}}
	c := New(serve(t, svc, 2))
	defer c.Close()
	_, err := c.List(testCtx(t))
	if !IsUnavailable(err) || !Retryable(err) || !errors.Is(err, ttrpc.ErrClosed) {
		t.Fatalf("List over two broken connections answered %v; want a retryable UNAVAILABLE wrapping ttrpc.ErrClosed", err)
	}
	// The third connection is served: the same client recovers.
	if _, err := c.List(testCtx(t)); err != nil {
		t.Fatalf("List on a new connection answered %v", err)
	}
}

// The daemon's status errors are whole-request CallErrors with its code and message, never retried
// by the client itself.
func TestStatusErrorsAreCallErrors(t *testing.T) {
	var calls atomic.Int32
	gate := "nri-accel is waiting for the container runtime's Synchronize; retry shortly"
	svc := &fakeService{unprepare: func(context.Context, *claimsv1.UnprepareRequest) (*claimsv1.UnprepareResponse, error) {
		calls.Add(1)
		return nil, status.Error(codes.Unavailable, gate)
	}}
	c := New(serve(t, svc, 0))
	defer c.Close()
	_, err := c.Unprepare(testCtx(t), []*claimsv1.ClaimRef{Ref("ns", "n", "u1")})
	var ce *CallError
	if !errors.As(err, &ce) || ce.Method != "Unprepare" || ce.Code != Unavailable || ce.Message != gate || calls.Load() != 1 {
		t.Fatalf("answered %v (%d calls); want one call, CallError Unprepare UNAVAILABLE with the daemon's message", err, calls.Load())
	}
}

// The call timeout bounds a call the daemon does not answer, and a sooner deadline of the
// caller's context wins over it.
func TestDeadlines(t *testing.T) {
	block := make(chan struct{})
	defer close(block)
	svc := &fakeService{status: func(ctx context.Context, _ *claimsv1.StatusRequest) (*claimsv1.StatusResponse, error) {
		select {
		case <-block:
		case <-ctx.Done():
		}
		return nil, status.Error(codes.DeadlineExceeded, "too late")
	}}
	sock := serve(t, svc, 0)

	short := New(sock, WithCallTimeout(50*time.Millisecond))
	defer short.Close()
	_, err := short.Status(context.Background())
	if CodeOf(err) != DeadlineExceeded || !errors.Is(err, context.DeadlineExceeded) || !Retryable(err) {
		t.Fatalf("Status past the call timeout answered %v; want DEADLINE_EXCEEDED", err)
	}

	long := New(sock, WithCallTimeout(time.Hour))
	defer long.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err = long.Status(ctx)
	if CodeOf(err) != DeadlineExceeded || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Status past the caller's deadline answered %v; want DEADLINE_EXCEEDED", err)
	}

	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	_, err = long.Status(ctx)
	if CodeOf(err) != Canceled || !errors.Is(err, context.Canceled) {
		t.Fatalf("Status with a canceled context answered %v; want CANCELED", err)
	}
}

// Every claim sent has an entry in the answer, even one the daemon left out.
func TestEveryClaimIsAnswered(t *testing.T) {
	svc := &fakeService{
		prepare: func(context.Context, *claimsv1.PrepareRequest) (*claimsv1.PrepareResponse, error) {
			return &claimsv1.PrepareResponse{Claims: map[string]*claimsv1.PrepareResult{
				"u1": granted("u1"),
				"u2": {Error: "claim u2 refused: device gpu0 is held by claim u1 until that claim is unprepared"},
			}}, nil
		},
		unprepare: func(context.Context, *claimsv1.UnprepareRequest) (*claimsv1.UnprepareResponse, error) {
			return &claimsv1.UnprepareResponse{Claims: map[string]*claimsv1.UnprepareResult{"u1": {}}}, nil
		},
	}
	c := New(serve(t, svc, 0))
	defer c.Close()
	res, err := c.Prepare(testCtx(t), []*claimsv1.Claim{
		FromAllocation("ns", "a", "u1", nil), FromAllocation("ns", "b", "u2", nil), FromAllocation("ns", "c", "u3", nil),
	})
	if err != nil {
		t.Fatal(err)
	}
	if res["u1"].Err != nil || len(res["u1"].Devices) != 1 {
		t.Fatalf("u1 answered %v", res["u1"])
	}
	if re, ok := AsRefusal(res["u2"].Err); !ok || re.UID != "u2" || len(re.Holders) != 1 || re.Holders[0].Claim != "u1" {
		t.Fatalf("u2 answered %v; want a refusal naming holder u1", res["u2"].Err)
	}
	if !errors.Is(res["u3"].Err, ErrNotAnswered) {
		t.Fatalf("u3, left out of the answer, answered %v; want ErrNotAnswered", res["u3"].Err)
	}
	errs, err := c.Unprepare(testCtx(t), []*claimsv1.ClaimRef{Ref("ns", "a", "u1"), Ref("", "", "u2")})
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := errs["u1"]; !ok || v != nil || !errors.Is(errs["u2"], ErrNotAnswered) {
		t.Fatalf("Unprepare answered %v; want u1 released and u2 not answered", errs)
	}
}

// No daemon: UNAVAILABLE naming the socket; a closed client says so.
func TestNoDaemonAndClosedClient(t *testing.T) {
	c := New(filepath.Join(t.TempDir(), "none.sock"))
	_, err := c.List(testCtx(t))
	var ce *CallError
	if !errors.As(err, &ce) || ce.Code != Unavailable || !Retryable(err) {
		t.Fatalf("List without a daemon answered %v; want a retryable UNAVAILABLE", err)
	}
	c.Close()
	if _, err := c.List(testCtx(t)); !errors.Is(err, ErrClientClosed) {
		t.Fatalf("List on a closed client answered %v; want ErrClientClosed", err)
	}
}

func TestFromAllocation(t *testing.T) {
	results := []Result{
		{Request: "gpu", Driver: "accel.nri.io", Pool: "whole", Device: "whole-gpu0"},
		{Request: "nic", Driver: "other.example.com", Pool: "p", Device: "d"},
		{Request: "share", Driver: "accel.nri.io", Pool: "shared", Device: "shared-gpu2", ShareID: "s-1"},
	}
	got := FromAllocation("ns", "name", "uid", ForDriver("accel.nri.io", results))
	share := "s-1"
	want := &claimsv1.Claim{Namespace: "ns", Name: "name", Uid: "uid", Ask: &claimsv1.Claim_Results{Results: &claimsv1.AllocationResults{
		Results: []*claimsv1.AllocationResult{
			{Request: "gpu", Driver: "accel.nri.io", Pool: "whole", Device: "whole-gpu0"},
			{Request: "share", Driver: "accel.nri.io", Pool: "shared", Device: "shared-gpu2", ShareId: &share},
		},
	}}}
	if !proto.Equal(got, want) {
		t.Fatalf("FromAllocation built %v; want %v", got, want)
	}
	if r := Ref("ns", "name", "uid"); r.GetNamespace() != "ns" || r.GetName() != "name" || r.GetUid() != "uid" {
		t.Fatalf("Ref built %v", r)
	}
}
