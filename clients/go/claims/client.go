// Package claims is a Go client of nri-accel's claims API: ttrpc on a unix socket, service
// nriaccel.claims.v1.Claims (plugin/proto/claims.proto, docs/claims-api.md).
//
// A DRA driver forwards kubelet's NodePrepareResources and NodeUnprepareResources to
// [Client.Prepare] and [Client.Unprepare] one to one, building each claim with [FromAllocation]
// and [Ref]; nri-accel stays the one arbiter of the node's devices.
//
// Errors come in two kinds, as in the API:
//   - a whole-request failure (the gate is closed, a deadline, a closed connection, a refused
//     caller) is the error return, a [*CallError] carrying the ttrpc status code; no claim was
//     answered, and the caller retries the whole call when [Retryable] says so;
//   - a per-claim refusal is the Err of that claim's result, a [*RefusalError] with the whole
//     sentence and, when another claim holds the device, the holder; that claim was granted
//     nothing by the call (or stays as it was, for Unprepare), and its siblings are unaffected.
//
// Prepare and Unprepare are idempotent per claim UID (a claim prepared again answers the same
// devices; unpreparing an unknown claim is success), so retrying a call whose answer was lost is
// always safe. The client does it once by itself when it finds its connection broken (the daemon
// restarted, or closed an idle connection): it dials again and sends the call again.
package claims

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/containerd/ttrpc"

	"nri-accel/clients/go/claimsv1"
)

// DefaultSocket is where nri-accel serves the claims API unless its config says otherwise
// (claims_api.socket).
const DefaultSocket = "/run/nri-accel/claims.sock"

// DefaultCallTimeout bounds every call unless the caller's context ends sooner. It is below the
// 45 s kubelet gives a DRA driver, so a forwarded call answers the kubelet before it gives up
// (the Rust client uses the same figure).
const DefaultCallTimeout = 40 * time.Second

// DefaultDialTimeout bounds connecting to the socket.
const DefaultDialTimeout = 5 * time.Second

// ErrClientClosed is returned by calls made after [Client.Close].
var ErrClientClosed = errors.New("the nri-accel claims client was closed; create a new one with claims.New")

// Option changes a [Client] made by [New].
type Option func(*Client)

// WithCallTimeout sets the deadline given to each call (default [DefaultCallTimeout]); a
// deadline of the caller's context that comes sooner wins. Zero or less leaves only the
// caller's deadline.
func WithCallTimeout(d time.Duration) Option {
	return func(c *Client) { c.callTimeout = d }
}

// WithDialTimeout sets how long connecting to the socket may take (default
// [DefaultDialTimeout]); the call's own deadline wins when sooner.
func WithDialTimeout(d time.Duration) Option {
	return func(c *Client) { c.dialTimeout = d }
}

// Client calls nri-accel's claims API on one socket. It is safe for concurrent use; calls share
// one connection, made on the first call and made again after it breaks.
type Client struct {
	socket      string
	callTimeout time.Duration
	dialTimeout time.Duration

	mu     sync.Mutex
	conn   *connection
	closed bool
}

// connection is one ttrpc connection and the generated client on it.
type connection struct {
	ttrpc *ttrpc.Client
	svc   claimsv1.ClaimsService
}

// New returns a client of the claims API served on socketPath ([DefaultSocket] when empty).
// Nothing is dialed until the first call, so New never fails; a daemon that is not running shows
// as an UNAVAILABLE [*CallError] from that call.
func New(socketPath string, opts ...Option) *Client {
	if socketPath == "" {
		socketPath = DefaultSocket
	}
	c := &Client{
		socket:      socketPath,
		callTimeout: DefaultCallTimeout,
		dialTimeout: DefaultDialTimeout,
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Socket is the path the client dials.
func (c *Client) Socket() string { return c.socket }

// Close closes the connection; calls made afterwards fail with [ErrClientClosed]. Calls in
// flight end with an error.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	if c.conn == nil {
		return nil
	}
	err := c.conn.ttrpc.Close()
	c.conn = nil
	return err
}

// connect returns the current connection, dialing one when there is none.
func (c *Client) connect(ctx context.Context) (*connection, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClientClosed
	}
	if c.conn != nil {
		return c.conn, nil
	}
	dialCtx := ctx
	if c.dialTimeout > 0 {
		var cancel context.CancelFunc
		dialCtx, cancel = context.WithTimeout(ctx, c.dialTimeout)
		defer cancel()
	}
	var d net.Dialer
	nc, err := d.DialContext(dialCtx, "unix", c.socket)
	if err != nil {
		return nil, err
	}
	conn := &connection{}
	// The daemon closes idle connections (claims_api.idle_timeout_seconds) and, under a flood,
	// evicts quiet ones: forget a connection as soon as its reader sees it end, so the next call
	// dials instead of failing first.
	conn.ttrpc = ttrpc.NewClient(nc, ttrpc.WithOnClose(func() { c.forget(conn) }))
	conn.svc = claimsv1.NewClaimsClient(conn.ttrpc)
	c.conn = conn
	return conn, nil
}

// forget drops conn when it is still the current connection, and closes it.
func (c *Client) forget(conn *connection) {
	c.mu.Lock()
	if c.conn == conn {
		c.conn = nil
	}
	c.mu.Unlock()
	// ttrpc closes a client once, so a second Close (from Close, or the reader's own end) is
	// harmless; in a goroutine, since this may run on ttrpc's close callback.
	go conn.ttrpc.Close()
}

// idempotent says which methods a client may send again when it cannot know whether the daemon
// saw the first attempt (docs/claims-api.md, "Idempotency"): Prepare answers a prepared claim's
// grant again and Unprepare of an unknown claim is success; List and Status change nothing.
var idempotent = map[string]bool{
	"Prepare":   true,
	"Unprepare": true,
	"List":      true,
	"Status":    true,
}

// call runs one method with the call deadline, redialing once and sending again when the
// connection turns out broken and the method is idempotent. Every error it returns is a
// [*CallError] (or [ErrClientClosed]).
func (c *Client) call(ctx context.Context, method string, do func(context.Context, claimsv1.ClaimsService) error) error {
	if c.callTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.callTimeout)
		defer cancel()
	}
	for attempt := 0; ; attempt++ {
		conn, err := c.connect(ctx)
		if err != nil {
			if errors.Is(err, ErrClientClosed) {
				return err
			}
			if ctxErr := ctx.Err(); ctxErr != nil {
				return contextError(method, ctxErr, err)
			}
			return &CallError{
				Method:  method,
				Code:    Unavailable,
				Message: fmt.Sprintf("cannot connect to nri-accel's claims socket %s: %v; is nri-accel running (and this process allowed to use the socket)?", c.socket, err),
				Err:     err,
			}
		}
		err = do(ctx, conn.svc)
		if err == nil {
			return nil
		}
		if errors.Is(err, ttrpc.ErrClosed) {
			c.forget(conn)
			if attempt == 0 && idempotent[method] && ctx.Err() == nil {
				continue
			}
			return &CallError{
				Method:  method,
				Code:    Unavailable,
				Message: fmt.Sprintf("the connection to nri-accel's claims socket %s closed before the answer came (the daemon restarted or closed it); retry the call", c.socket),
				Err:     err,
			}
		}
		return callError(ctx, method, err)
	}
}

// Prepare asks nri-accel to prepare each claim and answers one [PrepareResult] per claim UID, for
// every claim sent. The error return is a whole-request failure ([*CallError]): nothing was
// answered and the caller retries the whole call (kubelet does, for a driver that forwards it).
func (c *Client) Prepare(ctx context.Context, claims []*claimsv1.Claim) (map[string]PrepareResult, error) {
	var resp *claimsv1.PrepareResponse
	err := c.call(ctx, "Prepare", func(ctx context.Context, svc claimsv1.ClaimsService) error {
		var err error
		resp, err = svc.Prepare(ctx, &claimsv1.PrepareRequest{Claims: claims})
		return err
	})
	if err != nil {
		return nil, err
	}
	out := make(map[string]PrepareResult, len(claims))
	for uid, r := range resp.GetClaims() {
		if r.GetError() != "" {
			out[uid] = PrepareResult{Err: newRefusal(uid, r.GetError())}
			continue
		}
		out[uid] = PrepareResult{Devices: r.GetDevices()}
	}
	for _, cl := range claims {
		if _, ok := out[cl.GetUid()]; !ok {
			out[cl.GetUid()] = PrepareResult{Err: notAnswered(cl.GetUid(), "Prepare")}
		}
	}
	return out, nil
}

// PrepareResult is what Prepare answered for one claim: the granted devices, or Err (a
// [*RefusalError]) saying why nothing was granted.
type PrepareResult struct {
	// Devices granted, as kubelet's DRA Device (pool, device, request names, CDI ids).
	Devices []*claimsv1.Device
	// Err is nil on success; otherwise the claim's refusal, and Devices is empty.
	Err error
}

// Unprepare asks nri-accel to release each claim and answers, per claim UID, nil (released, or
// not held) or the claim's [*RefusalError] (nothing released: for example a container still uses
// it). The error return is a whole-request failure ([*CallError]).
func (c *Client) Unprepare(ctx context.Context, claims []*claimsv1.ClaimRef) (map[string]error, error) {
	var resp *claimsv1.UnprepareResponse
	err := c.call(ctx, "Unprepare", func(ctx context.Context, svc claimsv1.ClaimsService) error {
		var err error
		resp, err = svc.Unprepare(ctx, &claimsv1.UnprepareRequest{Claims: claims})
		return err
	})
	if err != nil {
		return nil, err
	}
	out := make(map[string]error, len(claims))
	for uid, r := range resp.GetClaims() {
		if r.GetError() != "" {
			out[uid] = newRefusal(uid, r.GetError())
			continue
		}
		out[uid] = nil
	}
	for _, cl := range claims {
		if _, ok := out[cl.GetUid()]; !ok {
			out[cl.GetUid()] = notAnswered(cl.GetUid(), "Unprepare")
		}
	}
	return out, nil
}

// List answers the claims the node holds (prepared, half-prepared and adopted ones) with their
// devices. It is served while the gate is closed.
func (c *Client) List(ctx context.Context) ([]*claimsv1.ClaimInfo, error) {
	var resp *claimsv1.ListResponse
	err := c.call(ctx, "List", func(ctx context.Context, svc claimsv1.ClaimsService) error {
		var err error
		resp, err = svc.List(ctx, &claimsv1.ListRequest{})
		return err
	})
	if err != nil {
		return nil, err
	}
	return resp.GetClaims(), nil
}

// Status answers the daemon's status: whether the gate is open and the document
// `nri-accel status --json` prints. It is served while the gate is closed.
func (c *Client) Status(ctx context.Context) (*Status, error) {
	var resp *claimsv1.StatusResponse
	err := c.call(ctx, "Status", func(ctx context.Context, svc claimsv1.ClaimsService) error {
		var err error
		resp, err = svc.Status(ctx, &claimsv1.StatusRequest{})
		return err
	})
	if err != nil {
		return nil, err
	}
	return newStatus(resp.GetGateOpen(), resp.GetJson())
}
