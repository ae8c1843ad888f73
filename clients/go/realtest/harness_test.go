package realtest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/log"
	nri "github.com/containerd/nri/pkg/adaptation"

	"nri-accel/clients/go/claims"
)

// wait bounds anything a test waits for; it is never an assertion on speed.
const wait = 60 * time.Second

// daemonBin is the nri-accel binary under test: NRI_ACCEL_BIN, or the workspace's debug build.
func daemonBin(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("NRI_ACCEL_BIN")
	if bin == "" {
		bin = "../../../target/debug/nri-accel"
	}
	abs, err := filepath.Abs(bin)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(abs); err != nil {
		t.Skipf("no nri-accel binary at %s (build it with cargo build -p nri-accel, or set NRI_ACCEL_BIN): these tests run the client against the real daemon", abs)
	}
	return abs
}

// node is a test node: the real nri-accel daemon with a static inventory, its own state, CDI
// dir and claims socket in a temp dir, connected to an NRI runtime served in this process by
// containerd's own NRI library (the runtime side containerd embeds), whose Synchronize opens
// the daemon's gate. No root, no container runtime.
type node struct {
	t       *testing.T
	bin     string
	dir     string
	config  string
	cdiDir  string
	nriSock string
	claims  string
	log     string
	runtime *exec.Cmd
	// runtimeStdin is the runtime's stdin; closing it ends the runtime.
	runtimeStdin io.WriteCloser
	daemon       *exec.Cmd
	exited       chan struct{}
}

// Devices of the node: pool whole (exclusive) has gpu0 and gpu1, pool shared has gpu2 (2 replicas).
const nodeYAML = `discovery:
  sysfs: false
  cpus: "0-3"
  static_devices:
%s
pools:
  - name: whole
    select: { ids: [gpu0, gpu1] }
    family: { kind: exclusive }
  - name: shared
    select: { ids: [gpu2] }
    family: { kind: shared, replicas: 2, memory_mib_per_share: 8192 }
`

func newNode(t *testing.T) *node {
	t.Helper()
	return newNodeWith(t, "")
}

// newNodeWith is newNode with claimsAPI (indented lines of the claims_api section) added to the
// config.
func newNodeWith(t *testing.T, claimsAPI string) *node {
	t.Helper()
	bin := daemonBin(t)
	// Unix socket paths are limited to 108 bytes: a short temp dir rather than t.TempDir().
	dir, err := os.MkdirTemp("", "nac-")
	if err != nil {
		t.Fatal(err)
	}
	n := &node{
		t:       t,
		bin:     bin,
		dir:     dir,
		config:  filepath.Join(dir, "config.yaml"),
		cdiDir:  filepath.Join(dir, "cdi"),
		nriSock: filepath.Join(dir, "nri.sock"),
		claims:  filepath.Join(dir, "run", "claims.sock"),
		log:     filepath.Join(dir, "nri-accel.log"),
	}
	var devs strings.Builder
	for i := 0; i < 3; i++ {
		fmt.Fprintf(&devs, "    - id: gpu%d\n      vendor: acme\n      model: a1\n      numa_node: 0\n      local_cpus: \"0-3\"\n"+
			"      memory_mib: 16384\n      compute_units: 8\n      nodes:\n        - { path: /dev/acme%d, major: 511, minor: %d }\n", i, i, i)
	}
	cfg := fmt.Sprintf("state_dir: %s\nnri:\n  socket: %s\nclaims_api:\n  socket: %s\n%scdi:\n  dir: %s\nreconcile_interval_secs: 0\n",
		filepath.Join(dir, "state"), n.nriSock, n.claims, claimsAPI, n.cdiDir) + fmt.Sprintf(nodeYAML, strings.TrimRight(devs.String(), "\n"))
	must(t, os.MkdirAll(n.cdiDir, 0o755))
	must(t, os.WriteFile(n.config, []byte(cfg), 0o644))
	t.Cleanup(n.cleanup)
	n.startRuntime()
	return n
}

// runtimeEnv names the NRI socket a re-executed test binary serves as the container runtime.
const runtimeEnv = "NRI_ACCEL_CLIENT_TEST_RUNTIME"

// startRuntime starts the container runtime's side of NRI on the node's socket, with no pods and
// no containers, in a process of its own (this test binary run again), so that stopping it
// closes nri-accel's NRI connection as a runtime restart does.
func (n *node) startRuntime() {
	t := n.t
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), runtimeEnv+"="+n.nriSock)
	cmd.Stderr = os.Stderr
	// The runtime ends when this pipe closes, so a test binary that dies takes it along; the
	// node keeps its end (a dropped one could be closed by the garbage collector).
	stdin, err := cmd.StdinPipe()
	must(t, err)
	out, err := cmd.StdoutPipe()
	must(t, err)
	must(t, cmd.Start())
	// The runtime prints one line once it listens.
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != "listening" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("the test's NRI runtime did not start: %q, %v", line, err)
	}
	n.runtime = cmd
	n.runtimeStdin = stdin
}

// stopRuntime kills the runtime's process: nri-accel sees its NRI connection closed.
func (n *node) stopRuntime() {
	if n.runtime == nil {
		return
	}
	n.runtime.Process.Kill()
	n.runtime.Wait()
	n.runtime = nil
}

// serveRuntime is the runtime's process: containerd's NRI library serving sock, answering every
// plugin's Synchronize with no pods and no containers, until it is killed.
func serveRuntime(sock string) {
	_ = log.SetLevel("warn")
	sync := func(ctx context.Context, cb nri.SyncCB) error {
		_, err := cb(ctx, nil, nil)
		return err
	}
	update := func(context.Context, []*nri.ContainerUpdate) ([]*nri.ContainerUpdate, error) { return nil, nil }
	// No plugins to launch: an empty directory beside the socket, in the node's temp dir (this
	// process is killed, so it removes nothing itself).
	empty := filepath.Join(filepath.Dir(sock), "nri-plugins")
	err := os.MkdirAll(empty, 0o755)
	if err == nil {
		var r *nri.Adaptation
		r, err = nri.New("client-test-runtime", "v0.0.0", sync, update,
			nri.WithSocketPath(sock), nri.WithPluginPath(empty), nri.WithPluginConfigPath(empty))
		if err == nil {
			err = r.Start()
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "NRI runtime on %s: %v\n", sock, err)
		os.Exit(1)
	}
	fmt.Println("listening")
	// Until the test binary goes (its end of stdin closes) or kills this process.
	_, _ = io.Copy(io.Discard, os.Stdin)
	os.Exit(0)
}

// start runs `nri-accel run` and waits until Status says the gate is open.
func (n *node) start() {
	t := n.t
	t.Helper()
	logf, err := os.OpenFile(n.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	must(t, err)
	cmd := exec.Command(n.bin, "run", "--config", n.config)
	cmd.Env = append(os.Environ(), "NRI_ACCEL_LOG=info")
	cmd.Stdout, cmd.Stderr = logf, logf
	must(t, cmd.Start())
	logf.Close()
	n.daemon = cmd
	exited := make(chan struct{})
	n.exited = exited
	go func() { cmd.Wait(); close(exited) }()
	n.waitGate()
}

// waitGate waits until the daemon answers Status with the gate open.
func (n *node) waitGate() {
	t := n.t
	t.Helper()
	c := claims.New(n.claims)
	defer c.Close()
	deadline := time.Now().Add(wait)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err := c.Status(ctx)
		cancel()
		if err == nil && st.GateOpen {
			return
		}
		select {
		case <-n.exited:
			t.Fatalf("nri-accel exited before its gate opened; its log:\n%s", n.logText())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("nri-accel's gate did not open within %v (last: %v); its log:\n%s", wait, err, n.logText())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// kill9 kills the daemon with SIGKILL and waits for it to be gone.
func (n *node) kill9() {
	t := n.t
	t.Helper()
	must(t, n.daemon.Process.Signal(syscall.SIGKILL))
	<-n.exited
}

func (n *node) logText() string {
	b, _ := os.ReadFile(n.log)
	return string(b)
}

func (n *node) cleanup() {
	if n.daemon != nil {
		select {
		case <-n.exited:
		default:
			n.daemon.Process.Signal(syscall.SIGTERM)
			select {
			case <-n.exited:
			case <-time.After(10 * time.Second):
				n.daemon.Process.Kill()
				<-n.exited
			}
		}
	}
	n.stopRuntime()
	if n.t.Failed() {
		n.t.Logf("nri-accel's log:\n%s", n.logText())
	}
	os.RemoveAll(n.dir)
}

// cdiSpecs lists the CDI spec files the daemon keeps.
func (n *node) cdiSpecs() []string {
	entries, err := os.ReadDir(n.cdiDir)
	must(n.t, err)
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// ctx is a context bounded by wait.
func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), wait)
	t.Cleanup(cancel)
	return c
}

// TestMain runs the tests, or, in the runtime's process, the runtime.
func TestMain(m *testing.M) {
	if sock := os.Getenv(runtimeEnv); sock != "" {
		serveRuntime(sock)
		return
	}
	os.Exit(m.Run())
}
