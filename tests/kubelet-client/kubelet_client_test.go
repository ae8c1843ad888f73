// Package kubeletclient calls the nri-accel binary's kubelet-facing sockets the way the kubelet
// does: grpc-go, the kubelet's own generated clients (k8s.io/kubelet), and dials copied in
// shape from the kubelet's sources, which dial the bare socket path through a custom unix
// dialer without WithAuthority. grpc-go then sends the percent-encoded path as the HTTP/2
// :authority, which the HTTP/2 server under nri-accel once reset as malformed.
//
// The node is simulated in a temp dir: static devices, the runtime played by containerd's NRI
// adaptation (github.com/containerd/nri, the code containerd and CRI-O embed), which
// synchronizes with nri-accel so that its gate opens, and the kubelet's device plugin
// registration served here. The API server is not simulated: its kubeconfig points at a closed
// port, so NodePrepareResources reaches nri-accel's DRA service and is answered per claim with
// the read failure, while NodeUnprepareResources, the health stream and the device plugin,
// which need no API server, answer in full.
//
// The binary is $NRI_ACCEL_BIN, else $CARGO_TARGET_DIR/debug/nri-accel, else
// ../../target/debug/nri-accel (build it first: cargo build -p nri-accel).
package kubeletclient

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/adaptation"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	dpapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	healthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	healthv1alpha1 "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drav1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

const (
	driver   = "accel.nri.io"
	resource = "accel.nri.io/whole"
	// wait guards against a hang only; nothing asserts on how long anything takes.
	wait = 60 * time.Second
)

func binary(t *testing.T) string {
	t.Helper()
	path := os.Getenv("NRI_ACCEL_BIN")
	if path == "" {
		target := os.Getenv("CARGO_TARGET_DIR")
		if target == "" {
			target = filepath.Join("..", "..", "target")
		}
		path = filepath.Join(target, "debug", "nri-accel")
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(abs); err != nil {
		t.Fatalf("no nri-accel binary at %s (build it with cargo build -p nri-accel, or set NRI_ACCEL_BIN): %v", abs, err)
	}
	return abs
}

// dialLikeThePluginWatcher dials as the kubelet's plugin watcher does for GetInfo
// (pkg/kubelet/pluginmanager/operationexecutor: DialContext on the bare path, a unix dialer,
// blocking, no authority).
func dialLikeThePluginWatcher(ctx context.Context, t *testing.T, path string) *grpc.ClientConn {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	//nolint:staticcheck // the kubelet still dials with DialContext and WithBlock.
	conn, err := grpc.DialContext(ctx, path,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithBlock(),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", addr)
		}),
	)
	if err != nil {
		t.Fatalf("dial %s: %v", path, err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// dialLikeTheDRAClient dials as the kubelet's DRA client did before it moved to "unix:"
// targets (pkg/kubelet/cm/dra/plugin: Dial on the bare endpoint, a unix dialer, no authority).
// The device plugin's socket is dialled the same way: stricter than the kubelet's device
// manager, which sets WithAuthority("localhost").
func dialLikeTheDRAClient(t *testing.T, path string) *grpc.ClientConn {
	t.Helper()
	//nolint:staticcheck // the kubelet dialled with Dial.
	conn, err := grpc.Dial(path,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, target string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", target)
		}),
	)
	if err != nil {
		t.Fatalf("dial %s: %v", path, err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// kubeletRegistration is the kubelet's device plugin Registration service on kubelet.sock.
type kubeletRegistration struct {
	dpapi.UnimplementedRegistrationServer
	mu       sync.Mutex
	requests []*dpapi.RegisterRequest
	got      chan struct{}
}

func (k *kubeletRegistration) Register(_ context.Context, r *dpapi.RegisterRequest) (*dpapi.Empty, error) {
	k.mu.Lock()
	k.requests = append(k.requests, r)
	k.mu.Unlock()
	select {
	case k.got <- struct{}{}:
	default:
	}
	return &dpapi.Empty{}, nil
}

// node is one simulated node with nri-accel running on it.
type node struct {
	root, registry, plugins, devicePlugins string
	registration                           *kubeletRegistration
	log                                    string
}

func (n *node) draSocket() string { return filepath.Join(n.plugins, driver, "dra.sock") }
func (n *node) regSocket() string { return filepath.Join(n.registry, driver+"-reg.sock") }

func waitForFile(t *testing.T, path string, n *node) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(n.log)
			t.Fatalf("waited for %s; nri-accel's log:\n%s", path, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func startNode(t *testing.T) *node {
	t.Helper()
	// Short paths: unix socket paths are limited to 108 bytes.
	root, err := os.MkdirTemp("", "kc-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	n := &node{
		root:          root,
		registry:      filepath.Join(root, "kubelet", "plugins_registry"),
		plugins:       filepath.Join(root, "kubelet", "plugins"),
		devicePlugins: filepath.Join(root, "kubelet", "device-plugins"),
		registration:  &kubeletRegistration{got: make(chan struct{}, 1)},
		log:           filepath.Join(root, "nri-accel.log"),
	}
	for _, d := range []string{n.registry, n.plugins, n.devicePlugins, filepath.Join(root, "nri-plugins"), filepath.Join(root, "nri-conf")} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}

	// The kubelet's device plugin registration socket.
	lis, err := net.Listen("unix", filepath.Join(n.devicePlugins, "kubelet.sock"))
	if err != nil {
		t.Fatal(err)
	}
	kubelet := grpc.NewServer()
	dpapi.RegisterRegistrationServer(kubelet, n.registration)
	go kubelet.Serve(lis)
	t.Cleanup(kubelet.Stop)

	// The runtime: containerd's NRI adaptation, synchronizing an empty node.
	nriSocket := filepath.Join(root, "nri.sock")
	syncFn := func(ctx context.Context, cb adaptation.SyncCB) error {
		_, err := cb(ctx, nil, nil)
		return err
	}
	update := func(context.Context, []*adaptation.ContainerUpdate) ([]*adaptation.ContainerUpdate, error) {
		return nil, nil
	}
	runtime, err := adaptation.New("kubelet-client-test", "v0.0.0", syncFn, update,
		adaptation.WithPluginPath(filepath.Join(root, "nri-plugins")),
		adaptation.WithPluginConfigPath(filepath.Join(root, "nri-conf")),
		adaptation.WithSocketPath(nriSocket),
	)
	if err != nil {
		t.Fatal(err)
	}
	if err := runtime.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(runtime.Stop)

	// An API server nobody answers at.
	kubeconfig := filepath.Join(root, "kubeconfig")
	writeFile(t, kubeconfig, `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://127.0.0.1:9"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`)
	config := filepath.Join(root, "config.yaml")
	writeFile(t, config, fmt.Sprintf(`state_dir: %[1]s/state
nri:
  socket: %[2]s
claims_api:
  socket: %[1]s/run/claims.sock
cdi:
  dir: %[1]s/cdi
reconcile_interval_secs: 0
discovery:
  sysfs: false
  cpus: "0-7"
  static_devices:
    - { id: gpu0, vendor: nvidia, model: H100, numa_node: 0, local_cpus: "0-3", nodes: [{ path: /dev/nvidia0, major: 195, minor: 0 }] }
    - { id: gpu1, vendor: nvidia, model: H100, numa_node: 0, local_cpus: "4-7", nodes: [{ path: /dev/nvidia1, major: 195, minor: 1 }] }
pools:
  - { name: whole, select: { ids: [gpu0, gpu1] }, family: { kind: exclusive } }
dra:
  enabled: true
  driver_name: %[3]s
  plugins_registry_dir: %[4]s
  plugins_dir: %[5]s
kubernetes:
  node_name: node-1
  kubeconfig: %[6]s
device_plugin:
  enabled: true
  dir: %[7]s
`, root, nriSocket, driver, n.registry, n.plugins, kubeconfig, n.devicePlugins))

	logFile, err := os.Create(n.log)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binary(t), "run", "--config", config)
	cmd.Env = append(os.Environ(), "NRI_ACCEL_LOG=info")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		logFile.Close()
		if t.Failed() {
			log, _ := os.ReadFile(n.log)
			t.Logf("nri-accel's log:\n%s", log)
		}
	})
	waitForFile(t, n.regSocket(), n)
	return n
}

func writeFile(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
}

// noProtocolError fails when err is the reset the HTTP/2 server gave a kubelet before.
func noProtocolError(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil && strings.Contains(err.Error(), "PROTOCOL_ERROR") {
		t.Fatalf("%s: the HTTP/2 server reset the kubelet's stream: %v", what, err)
	}
}

func TestEveryKubeletSocketAnswersTheKubeletsDial(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*wait)
	defer cancel()
	n := startNode(t)

	// Registration, as the plugin watcher: GetInfo, then the verdict.
	reg := registerapi.NewRegistrationClient(dialLikeThePluginWatcher(ctx, t, n.regSocket()))
	info, err := reg.GetInfo(ctx, &registerapi.InfoRequest{})
	noProtocolError(t, "GetInfo", err)
	if err != nil {
		t.Fatalf("GetInfo: %v", err)
	}
	if info.Type != registerapi.DRAPlugin || info.Name != driver || info.Endpoint != n.draSocket() {
		t.Fatalf("GetInfo answered %v", info)
	}
	for _, want := range []string{"v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"} {
		found := false
		for _, v := range info.SupportedVersions {
			found = found || v == want
		}
		if !found {
			t.Errorf("GetInfo does not list %s: %v", want, info.SupportedVersions)
		}
	}
	if _, err := reg.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		t.Fatalf("NotifyRegistrationStatus: %v", err)
	}

	// The device plugin registers once the runtime has synchronized.
	select {
	case <-n.registration.got:
	case <-time.After(wait):
		t.Fatal("nri-accel never registered its device plugin with kubelet.sock")
	}
	n.registration.mu.Lock()
	first := n.registration.requests[0]
	n.registration.mu.Unlock()
	if first.ResourceName != resource {
		t.Fatalf("registered %q", first.ResourceName)
	}

	// DRA, as the kubelet's DRA client; one connection for every call (HPACK indexes the
	// authority after the first).
	dra := dialLikeTheDRAClient(t, n.draSocket())
	v1 := drav1.NewDRAPluginClient(dra)
	v1beta1 := drav1beta1.NewDRAPluginClient(dra)
	for _, call := range []struct {
		name string
		do   func() (map[string]string, error)
	}{
		{"v1 NodePrepareResources", func() (map[string]string, error) {
			r, err := v1.NodePrepareResources(ctx, &drav1.NodePrepareResourcesRequest{Claims: []*drav1.Claim{{Namespace: "default", Uid: "uid-v1", Name: "c1"}}})
			if err != nil {
				return nil, err
			}
			out := map[string]string{}
			for uid, c := range r.Claims {
				out[uid] = c.Error
			}
			return out, nil
		}},
		{"v1beta1 NodePrepareResources", func() (map[string]string, error) {
			r, err := v1beta1.NodePrepareResources(ctx, &drav1beta1.NodePrepareResourcesRequest{Claims: []*drav1beta1.Claim{{Namespace: "default", Uid: "uid-v1beta1", Name: "c2"}}})
			if err != nil {
				return nil, err
			}
			out := map[string]string{}
			for uid, c := range r.Claims {
				out[uid] = c.Error
			}
			return out, nil
		}},
	} {
		answer, err := call.do()
		noProtocolError(t, call.name, err)
		if err != nil {
			t.Fatalf("%s: %v", call.name, err)
		}
		// No API server answers: the claim cannot be read, and the answer says so per claim.
		for uid, e := range answer {
			if e == "" {
				t.Errorf("%s: claim %s prepared without an API server", call.name, uid)
			}
		}
		if len(answer) != 1 {
			t.Errorf("%s: answered %v", call.name, answer)
		}
	}
	un1, err := v1.NodeUnprepareResources(ctx, &drav1.NodeUnprepareResourcesRequest{Claims: []*drav1.Claim{{Namespace: "default", Uid: "uid-v1", Name: "c1"}}})
	noProtocolError(t, "v1 NodeUnprepareResources", err)
	if err != nil || un1.Claims["uid-v1"] == nil || un1.Claims["uid-v1"].Error != "" {
		t.Fatalf("v1 NodeUnprepareResources: %v %v", un1, err)
	}
	un2, err := v1beta1.NodeUnprepareResources(ctx, &drav1beta1.NodeUnprepareResourcesRequest{Claims: []*drav1beta1.Claim{{Namespace: "default", Uid: "uid-v1beta1", Name: "c2"}}})
	noProtocolError(t, "v1beta1 NodeUnprepareResources", err)
	if err != nil || un2.Claims["uid-v1beta1"] == nil || un2.Claims["uid-v1beta1"].Error != "" {
		t.Fatalf("v1beta1 NodeUnprepareResources: %v %v", un2, err)
	}

	// The health stream, v1 and v1alpha1: opened, and the devices sent.
	watchCtx, stopWatch := context.WithCancel(ctx)
	h1, err := healthv1.NewDRAResourceHealthClient(dra).NodeWatchResources(watchCtx, &healthv1.NodeWatchResourcesRequest{})
	noProtocolError(t, "v1 NodeWatchResources", err)
	if err != nil {
		t.Fatalf("v1 NodeWatchResources: %v", err)
	}
	m1, err := h1.Recv()
	noProtocolError(t, "v1 NodeWatchResources", err)
	if err != nil || len(m1.Devices) == 0 {
		t.Fatalf("v1 health stream: %v %v", m1, err)
	}
	h0, err := healthv1alpha1.NewDRAResourceHealthClient(dra).NodeWatchResources(watchCtx, &healthv1alpha1.NodeWatchResourcesRequest{})
	if err != nil {
		t.Fatalf("v1alpha1 NodeWatchResources: %v", err)
	}
	m0, err := h0.Recv()
	noProtocolError(t, "v1alpha1 NodeWatchResources", err)
	if err != nil || len(m0.Devices) == 0 {
		t.Fatalf("v1alpha1 health stream: %v %v", m0, err)
	}
	stopWatch()

	// The device plugin, on the endpoint it registered.
	dp := dpapi.NewDevicePluginClient(dialLikeTheDRAClient(t, filepath.Join(n.devicePlugins, first.Endpoint)))
	opts, err := dp.GetDevicePluginOptions(ctx, &dpapi.Empty{})
	noProtocolError(t, "GetDevicePluginOptions", err)
	if err != nil || !opts.GetPreferredAllocationAvailable {
		t.Fatalf("GetDevicePluginOptions: %v %v", opts, err)
	}
	lw, err := dp.ListAndWatch(ctx, &dpapi.Empty{})
	if err != nil {
		t.Fatalf("ListAndWatch: %v", err)
	}
	listed, err := lw.Recv()
	noProtocolError(t, "ListAndWatch", err)
	if err != nil || len(listed.Devices) != 2 {
		t.Fatalf("ListAndWatch: %v %v", listed, err)
	}
	alloc, err := dp.Allocate(ctx, &dpapi.AllocateRequest{ContainerRequests: []*dpapi.ContainerAllocateRequest{{DevicesIds: []string{"gpu1"}}}})
	noProtocolError(t, "Allocate", err)
	if err != nil {
		t.Fatalf("Allocate: %v (%v)", err, status.Code(err))
	}
	if len(alloc.ContainerResponses) != 1 || len(alloc.ContainerResponses[0].CdiDevices) != 1 {
		t.Fatalf("Allocate answered %v", alloc)
	}
	if !strings.HasPrefix(alloc.ContainerResponses[0].CdiDevices[0].Name, driver+"/device=") {
		t.Fatalf("Allocate named %v", alloc.ContainerResponses[0].CdiDevices)
	}
}
