package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Accel is nri-accel on a test node: its config, state, CDI dir, claims socket and log.
type Accel struct {
	Bin      string
	Dir      string
	Config   string
	StateDir string
	CDIDir   string
	Claims   string
	Log      string
	process
}

// Fake accelerators: real char device nodes, mknodded by the suite under a temp dir of /dev.
// Their major has no driver, so opening one fails with ENXIO where the device cgroup lets it
// through and EPERM where it does not.
type fakeDevices struct {
	Dir   string
	Major uint32
}

// mkDevices creates n char device nodes accel0..accel<n-1> with an unused major.
func mkDevices(t *testing.T, n int) *fakeDevices {
	t.Helper()
	procDevices, _ := os.ReadFile("/proc/devices")
	major := uint32(300)
	for strings.Contains(string(procDevices), fmt.Sprintf("\n%d ", major)) {
		major++
	}
	dir, err := os.MkdirTemp("/dev", "nri-accel-e2e-")
	must(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	for i := 0; i < n; i++ {
		dev := int(mkdev(major, uint32(i)))
		path := filepath.Join(dir, fmt.Sprintf("accel%d", i))
		must(t, syscall.Mknod(path, syscall.S_IFCHR|0o666, dev))
		must(t, os.Chmod(path, 0o666)) // mknod applies the umask

	}
	return &fakeDevices{Dir: dir, Major: major}
}

func mkdev(major, minor uint32) uint64 {
	return uint64(minor&0xff) | uint64(major&0xfff)<<8 | uint64(minor&^0xff)<<12 | uint64(major&^0xfff)<<32
}

// Path is the node of fake device i.
func (d *fakeDevices) Path(i int) string { return filepath.Join(d.Dir, fmt.Sprintf("accel%d", i)) }

// Layout is the node's inventory and pools. Devices: accel0 (pool whole, exclusive,
// CPUsPerDevice local CPUs from CPU LocalCPU), accel1 (pool shared, 2 replicas), accel2 (pool
// sliced, 2 slots of profile half).
type Layout struct {
	CPUs          string
	LocalCPU      string
	CPUsPerDevice int
	// WholeDevices is how many devices pool whole has (default 1).
	WholeDevices int
	// MPSPipe and MPSLog put pool shared in MPS mode with these daemon directories (scenario l).
	MPSPipe, MPSLog string
	// HealthCheckSecs is discovery.health_check_secs (0: the default, 10 s).
	HealthCheckSecs int
}

func (l Layout) yaml(d *fakeDevices) string {
	whole := l.WholeDevices
	if whole == 0 {
		whole = 1
	}
	var b strings.Builder
	fmt.Fprintf(&b, "discovery:\n  sysfs: false\n  cpus: %q\n", l.CPUs)
	if l.HealthCheckSecs > 0 {
		fmt.Fprintf(&b, "  health_check_secs: %d\n", l.HealthCheckSecs)
	}
	b.WriteString("  static_devices:\n")
	dev := func(i int, id string) {
		fmt.Fprintf(&b, "    - id: %s\n      vendor: e2e\n      model: fake\n      numa_node: 0\n      local_cpus: %q\n"+
			"      memory_mib: 16384\n      compute_units: 8\n      nodes:\n        - { path: %s, major: %d, minor: %d }\n",
			id, l.LocalCPU, d.Path(i), d.Major, i)
	}
	var ids []string
	for i := 0; i < whole; i++ {
		ids = append(ids, fmt.Sprintf("accel%d", i))
		dev(i, ids[i])
	}
	dev(whole, "shared0")
	dev(whole+1, "sliced0")
	fmt.Fprintf(&b, "pools:\n  - name: whole\n    select: { ids: [%s] }\n    family: { kind: exclusive }\n    cpus_per_device: %d\n",
		strings.Join(ids, ", "), l.CPUsPerDevice)
	b.WriteString("  - name: shared\n    select: { ids: [shared0] }\n    family: { kind: shared, replicas: 2, memory_mib_per_share: 8192")
	if l.MPSPipe != "" {
		fmt.Fprintf(&b, ", mps: { pipe_directory: %q, log_directory: %q }", l.MPSPipe, l.MPSLog)
	}
	b.WriteString(" }\n")
	b.WriteString("  - name: sliced\n    select: { ids: [sliced0] }\n    family:\n      kind: sliced\n      slots: 2\n      profiles:\n" +
		"        - { name: half, size: 1, memory_mib: 8192, compute_units: 4, starts: [0, 1] }\n")
	return b.String()
}

// newAccel writes nri-accel's config for a node under dir talking to nriSock.
func newAccel(t *testing.T, dir, nriSock, mode string, layout Layout, devs *fakeDevices) *Accel {
	a := &Accel{
		Bin:      accelBin(t),
		Dir:      dir,
		Config:   filepath.Join(dir, "config.yaml"),
		StateDir: filepath.Join(dir, "state"),
		CDIDir:   filepath.Join(dir, "cdi"),
		Claims:   filepath.Join(dir, "run", "claims.sock"),
		Log:      filepath.Join(dir, "nri-accel.log"),
	}
	must(t, os.MkdirAll(a.CDIDir, 0o755))
	cfg := fmt.Sprintf("state_dir: %s\nnri:\n  socket: %s\n  cdi_injection: %s\nclaims_api:\n  socket: %s\n"+
		"cdi:\n  dir: %s\nreconcile_interval_secs: 0\n%s",
		a.StateDir, nriSock, mode, a.Claims, a.CDIDir, layout.yaml(devs))
	must(t, os.WriteFile(a.Config, []byte(cfg), 0o644))
	return a
}

// Start runs `nri-accel run` as an external plugin and waits for its gate to open.
func (a *Accel) Start(t *testing.T) {
	t.Helper()
	a.StartNoWait(t)
	a.WaitGate(t)
}

// StartNoWait runs `nri-accel run` and returns at once.
func (a *Accel) StartNoWait(t *testing.T) {
	t.Helper()
	cmd := exec.Command(a.Bin, "run", "--config", a.Config)
	cmd.Env = append(os.Environ(), "NRI_ACCEL_LOG=info")
	a.start(t, cmd, a.Log, "nri-accel")
}

// WaitGate waits until `status` says the gate is open.
func (a *Accel) WaitGate(t *testing.T) {
	t.Helper()
	if !waitFor(60*time.Second, func() bool {
		st, err := a.Status()
		return err == nil && st.GateOpen()
	}) {
		t.Fatalf("nri-accel's gate did not open (log %s):\n%s", a.Log, tail(a.Log, 30))
	}
}

// Kill9 kills nri-accel with SIGKILL and waits for it.
func (a *Accel) Kill9() { a.Kill() }

// Stop stops nri-accel (SIGTERM, then SIGKILL after 10 s).
func (a *Accel) Stop() { a.stop(10*time.Second, nil) }

// CLI runs an nri-accel subcommand against this node's config: stdout, stderr, error.
func (a *Accel) CLI(args ...string) (string, string, error) {
	cmd := exec.Command(a.Bin, append(args, "--config", a.Config)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	return out.String(), errb.String(), err
}

// Status is `nri-accel status --json`.
type Status map[string]any

// Status runs `nri-accel status --json`.
func (a *Accel) Status() (Status, error) {
	out, errs, err := a.CLI("status", "--json")
	if err != nil {
		return nil, fmt.Errorf("status: %v: %s", err, errs)
	}
	var st Status
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		return nil, fmt.Errorf("status --json: %v: %s", err, out)
	}
	return st, nil
}

// GateOpen is the status's gate.
func (s Status) GateOpen() bool {
	gate, _ := s["gate"].(map[string]any)
	v, _ := gate["open"].(bool)
	return v
}

// Claims answers the status's claims.
func (s Status) Claims() []map[string]any {
	var out []map[string]any
	list, _ := s["claims"].([]any)
	for _, c := range list {
		if m, ok := c.(map[string]any); ok {
			out = append(out, m)
		}
	}
	return out
}

// Held answers, per device id, the claims holding units of it.
func (s Status) Held() map[string][]string {
	out := map[string][]string{}
	policy, _ := s["policy"].(map[string]any)
	pools, _ := policy["pools"].([]any)
	for _, p := range pools {
		devs, _ := p.(map[string]any)["devices"].([]any)
		for _, d := range devs {
			dm, _ := d.(map[string]any)
			id, _ := dm["id"].(string)
			held, _ := dm["held"].([]any)
			for _, h := range held {
				claim, _ := h.(map[string]any)["claim"].(string)
				out[id] = append(out[id], claim)
			}
		}
	}
	return out
}

// SpecFiles lists the CDI spec files nri-accel has written.
func (a *Accel) SpecFiles() []string {
	ents, _ := os.ReadDir(a.CDIDir)
	var out []string
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".yaml") || strings.HasSuffix(e.Name(), ".json") {
			out = append(out, e.Name())
		}
	}
	return out
}
