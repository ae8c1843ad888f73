package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	rspec "github.com/opencontainers/runtime-spec/specs-go"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The NVIDIA side of the vendor-CDI scenarios (tests/README.md, "The NVIDIA Container Toolkit
// as oracle"): a fixture driver root with stand-in driver files, stand-in /dev/nvidia* nodes,
// and NVIDIA's CDI spec generated over them by the toolkit's own library (../nvidia-oracle),
// naming the toolkit's own hook binary built from the same module version.

// nvidiaDriverVersion is the version go-nvml's DGX A100 mock reports; the stand-in libraries
// carry it in their names as a real driver's do.
const nvidiaDriverVersion = "550.54.15"

// nvidiaLibs are the stand-in driver libraries: real ELF shared objects (so that ldconfig, run
// by the toolkit's update-ldcache hook inside the container, records them) with the sonames of
// the real ones.
var nvidiaLibs = []string{"libcuda", "libnvidia-ml", "libnvidia-ptxjitcompiler"}

// nvidiaLibDir is where the fixture's libraries are, relative to the driver root (Debian's
// multiarch dir, where the toolkit looks on amd64).
const nvidiaLibDir = "usr/lib/x86_64-linux-gnu"

// nvidiaTools are the oracle (generate, apply) and the toolkit's nvidia-cdi-hook.
type nvidiaTools struct {
	Oracle, Hook string
	// Versions is `nvidia-oracle version`: the toolkit, go-nvml and CDI library versions.
	Versions string
	// Took is how long the build took in this process.
	Took time.Duration
}

var (
	nvidiaToolsOnce  sync.Once
	nvidiaToolsBuilt nvidiaTools
	nvidiaToolsErr   error
)

// buildNvidiaTools builds ../nvidia-oracle and the toolkit's nvidia-cdi-hook from that
// module's go.mod (one toolkit version for both), once per test process, into a fixed dir
// under the temp dir (the hook's path is in the specs of containers that may outlive a test).
func buildNvidiaTools(t *testing.T) nvidiaTools {
	t.Helper()
	nvidiaToolsOnce.Do(func() {
		start := time.Now()
		dir := filepath.Join(os.TempDir(), "nri-accel-nvidia-oracle")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			nvidiaToolsErr = err
			return
		}
		cmd := exec.Command("go", "build", "-o", dir+"/", ".", "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook")
		cmd.Dir = filepath.Join(testsDir(), "nvidia-oracle")
		// go-nvml's bindings are cgo (the mock needs no libnvidia-ml, only the build needs gcc).
		cmd.Env = append(os.Environ(), "CGO_ENABLED=1", "CGO_CFLAGS=-w")
		if out, err := cmd.CombinedOutput(); err != nil {
			nvidiaToolsErr = fmt.Errorf("building tests/nvidia-oracle and nvidia-cdi-hook (go and gcc needed): %v\n%s", err, out)
			return
		}
		tools := nvidiaTools{Oracle: filepath.Join(dir, "nvidia-oracle"), Hook: filepath.Join(dir, "nvidia-cdi-hook"), Took: time.Since(start)}
		out, err := exec.Command(tools.Oracle, "version").CombinedOutput()
		if err != nil {
			nvidiaToolsErr = fmt.Errorf("nvidia-oracle version: %v\n%s", err, out)
			return
		}
		tools.Versions = strings.TrimSpace(string(out))
		nvidiaToolsBuilt = tools
	})
	if nvidiaToolsErr != nil {
		t.Fatal(nvidiaToolsErr)
	}
	return nvidiaToolsBuilt
}

// nvidiaGPU is one GPU of the generated spec, as the oracle lists it.
type nvidiaGPU struct {
	Index      int    `json:"index"`
	Minor      int    `json:"minor"`
	UUID       string `json:"uuid"`
	PCIAddress string `json:"pci_address"`
	Model      string `json:"model"`
}

// nvidiaFixture is one node's NVIDIA driver as the toolkit sees it, and the spec it generated.
type nvidiaFixture struct {
	Tools nvidiaTools
	// DriverRoot holds the stand-in libraries, nvidia-smi and firmware.
	DriverRoot string
	// DevRoot holds dev/nvidia<minor>, dev/nvidiactl, dev/nvidia-uvm and dev/nvidia-uvm-tools:
	// real char nodes with majors no driver owns (opening one says ENXIO), under /dev.
	DevRoot string
	// SpecDir holds the generated spec, nvidia.yaml, alone (cdi.vendor_spec_dirs).
	SpecDir string
	Major   uint32 // of nvidia<minor> and nvidiactl (255)
	UVM     uint32 // of nvidia-uvm (0) and nvidia-uvm-tools (1)
	GPUs    []nvidiaGPU
}

// newNvidiaFixture builds the driver root and device nodes for `gpus` GPUs of the DGX A100 mock
// and generates NVIDIA's spec over them. Everything goes at the test's end.
func newNvidiaFixture(t *testing.T, gpus int) *nvidiaFixture {
	t.Helper()
	tools := buildNvidiaTools(t)
	f := &nvidiaFixture{Tools: tools}
	var err error
	f.DriverRoot, err = os.MkdirTemp("", "nri-accel-nvidia-root-")
	must(t, err)
	t.Cleanup(func() { os.RemoveAll(f.DriverRoot) })
	f.SpecDir, err = os.MkdirTemp("", "nri-accel-nvidia-cdi-")
	must(t, err)
	t.Cleanup(func() { os.RemoveAll(f.SpecDir) })
	f.DevRoot, err = os.MkdirTemp("/dev", "nri-accel-e2e-nv-")
	must(t, err)
	t.Cleanup(func() { os.RemoveAll(f.DevRoot) })

	libDir := filepath.Join(f.DriverRoot, nvidiaLibDir)
	for _, d := range []string{libDir, filepath.Join(f.DriverRoot, "usr/bin"),
		filepath.Join(f.DriverRoot, "lib/firmware/nvidia", nvidiaDriverVersion), filepath.Join(f.DevRoot, "dev")} {
		must(t, os.MkdirAll(d, 0o755))
	}
	src := filepath.Join(f.DriverRoot, "stand-in.c")
	must(t, os.WriteFile(src, []byte("int nri_accel_stand_in(void) { return 0; }\n"), 0o644))
	for _, lib := range nvidiaLibs {
		out := filepath.Join(libDir, lib+".so."+nvidiaDriverVersion)
		if b, err := exec.Command("cc", "-shared", "-fPIC", "-Wl,-soname,"+lib+".so.1", "-o", out, src).CombinedOutput(); err != nil {
			t.Fatalf("building the stand-in %s (gcc needed): %v\n%s", out, err, b)
		}
	}
	must(t, os.Remove(src))
	must(t, os.WriteFile(filepath.Join(f.DriverRoot, "usr/bin/nvidia-smi"), []byte("#!/bin/sh\necho stand-in nvidia-smi "+nvidiaDriverVersion+"\n"), 0o755))
	must(t, os.WriteFile(filepath.Join(f.DriverRoot, "lib/firmware/nvidia", nvidiaDriverVersion, "gsp_ga10x.bin"), []byte("stand-in GSP firmware\n"), 0o644))

	// Majors of their own: the suite's fake accelerators (mkDevices) take the first free one
	// from 300, and one node under two ids is a config error.
	f.Major = freeMajor(t, 310)
	f.UVM = freeMajor(t, f.Major+1)
	mknod := func(name string, major, minor uint32) {
		path := filepath.Join(f.DevRoot, "dev", name)
		must(t, syscall.Mknod(path, syscall.S_IFCHR|0o666, int(mkdev(major, minor))))
		must(t, os.Chmod(path, 0o666))
	}
	for i := 0; i < gpus; i++ {
		mknod(fmt.Sprintf("nvidia%d", i), f.Major, uint32(i))
	}
	mknod("nvidiactl", f.Major, 255)
	mknod("nvidia-uvm", f.UVM, 0)
	mknod("nvidia-uvm-tools", f.UVM, 1)

	inventory := filepath.Join(f.DriverRoot, "..", filepath.Base(f.DriverRoot)+".gpus.json")
	t.Cleanup(func() { os.Remove(inventory) })
	cmd := exec.Command(tools.Oracle, "generate", "--driver-root", f.DriverRoot, "--dev-root", f.DevRoot,
		"--hook", tools.Hook, "--gpus", fmt.Sprint(gpus), "--out", f.Spec(), "--inventory", inventory)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("generating NVIDIA's spec: %v\n%s", err, out)
	}
	b, err := os.ReadFile(inventory)
	must(t, err)
	must(t, json.Unmarshal(b, &f.GPUs))
	for _, g := range f.GPUs {
		if g.Minor >= gpus {
			t.Fatalf("the mock's GPU %d has minor %d, beyond the %d nodes made", g.Index, g.Minor, gpus)
		}
	}
	return f
}

// Spec is the generated spec's path.
func (f *nvidiaFixture) Spec() string { return filepath.Join(f.SpecDir, "nvidia.yaml") }

// freeMajor is the first char major from `from` on that /proc/devices does not list.
func freeMajor(t *testing.T, from uint32) uint32 {
	procDevices, err := os.ReadFile("/proc/devices")
	must(t, err)
	m := from
	for strings.Contains(string(procDevices), fmt.Sprintf("\n%d ", m)) {
		m++
	}
	return m
}

// configure adds the fixture's GPUs to nri-accel's config as static devices (id gpu<index>,
// vendor nvidia, the mock's PCI address and UUID, own node /dev/nvidia<minor> and the control
// nodes a discovered NVIDIA GPU has) in a pool `gpus` (exclusive) with `vendor_cdi: <vendorCDI>`
// first, and the spec's dir as cdi.vendor_spec_dirs. "" leaves vendor_cdi out (its default).
func (f *nvidiaFixture) configure(t *testing.T, configPath, localCPU, vendorCDI string) {
	t.Helper()
	b, err := os.ReadFile(configPath)
	must(t, err)
	cfg := string(b)
	node := func(name string, major, minor uint32) string {
		return fmt.Sprintf("{ path: /dev/%s, host_path: %s, major: %d, minor: %d }",
			name, filepath.Join(f.DevRoot, "dev", name), major, minor)
	}
	var devs strings.Builder
	var ids []string
	for _, g := range f.GPUs {
		id := fmt.Sprintf("gpu%d", g.Index)
		ids = append(ids, id)
		fmt.Fprintf(&devs, "    - id: %s\n      vendor: nvidia\n      model: %q\n      pci_address: %q\n      uuid: %q\n      numa_node: 0\n"+
			"      local_cpus: %q\n      memory_mib: 40960\n      compute_units: 108\n      nodes:\n        - %s\n"+
			"      control_nodes:\n        - %s\n        - %s\n        - %s\n",
			id, g.Model, g.PCIAddress, g.UUID, localCPU, node(fmt.Sprintf("nvidia%d", g.Minor), f.Major, uint32(g.Minor)),
			node("nvidiactl", f.Major, 255), node("nvidia-uvm", f.UVM, 0), node("nvidia-uvm-tools", f.UVM, 1))
	}
	pool := fmt.Sprintf("  - name: gpus\n    select: { ids: [%s] }\n    family: { kind: exclusive }\n", strings.Join(ids, ", "))
	if vendorCDI != "" {
		pool += fmt.Sprintf("    vendor_cdi: %s\n", vendorCDI)
	}
	for _, edit := range [][2]string{
		{"pools:\n", devs.String() + "pools:\n" + pool},
		{"cdi:\n", fmt.Sprintf("cdi:\n  vendor_spec_dirs: [%q]\n", f.SpecDir)},
	} {
		if !strings.Contains(cfg, edit[0]) {
			t.Fatalf("nri-accel's config %s has no %q to extend", configPath, edit[0])
		}
		cfg = strings.Replace(cfg, edit[0], edit[1], 1)
	}
	must(t, os.WriteFile(configPath, []byte(cfg), 0o644))
}

// expected is what the Go CDI library makes of an empty container given vendor devices
// `devices` (qualified names) from the fixture's spec: the reference for nri-accel's edits.
func (f *nvidiaFixture) expected(t *testing.T, devices ...string) *rspec.Spec {
	t.Helper()
	empty := `{"ociVersion":"1.2.0","process":{"cwd":"/"},"linux":{}}`
	args := []string{"apply", "--spec-dir", f.SpecDir}
	for _, d := range devices {
		args = append(args, "--device", d)
	}
	cmd := exec.Command(f.Tools.Oracle, args...)
	cmd.Stdin = strings.NewReader(empty)
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("the Go CDI library applying %v: %v %s", devices, err, stderr)
	}
	var s rspec.Spec
	must(t, json.Unmarshal(out, &s))
	return &s
}

// runtimeSpec is the whole OCI spec the runtime made for container id (ContainerStatus verbose).
func (n *Node) runtimeSpec(t *testing.T, id string) *rspec.Spec {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := n.CRI.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: id, Verbose: true})
	if err != nil {
		t.Fatalf("ContainerStatus %s: %v", id, err)
	}
	var info struct {
		RuntimeSpec rspec.Spec `json:"runtimeSpec"`
	}
	if err := json.Unmarshal([]byte(r.Info["info"]), &info); err != nil {
		t.Fatalf("container %s: verbose info: %v", id, err)
	}
	return &info.RuntimeSpec
}

// compareVendorEdits answers how the runtime spec `got` disagrees with the Go CDI library's
// edits `want` for the same vendor devices: every mount (destination, source, type, options),
// device node (path, type, major, minor, mode, owner), device cgroup rule, env entry and hook
// (per stage, in order: path, args, env, timeout) of want must be in got; got must hold no
// other mount of the driver root, no other call of the toolkit's hook, and no device path or
// mount destination twice.
func compareVendorEdits(want, got *rspec.Spec, f *nvidiaFixture) []string {
	var diffs []string
	gotMounts := map[string][]rspec.Mount{}
	for _, m := range got.Mounts {
		gotMounts[m.Destination] = append(gotMounts[m.Destination], m)
	}
	wantDest := map[string]bool{}
	for _, w := range want.Mounts {
		wantDest[w.Destination] = true
		g := gotMounts[w.Destination]
		switch {
		case len(g) == 0:
			diffs = append(diffs, fmt.Sprintf("mount %s (from %s) is missing", w.Destination, w.Source))
		case len(g) > 1:
			diffs = append(diffs, fmt.Sprintf("mount %s is there %d times: %+v", w.Destination, len(g), g))
		case g[0].Source != w.Source || strings.Join(g[0].Options, ",") != strings.Join(w.Options, ",") ||
			(w.Type != "" && g[0].Type != w.Type):
			diffs = append(diffs, fmt.Sprintf("mount %s: got %+v, the CDI library makes %+v", w.Destination, g[0], w))
		}
	}
	for _, m := range got.Mounts {
		if strings.HasPrefix(m.Source, f.DriverRoot+"/") && !wantDest[m.Destination] {
			diffs = append(diffs, fmt.Sprintf("mount %s from the driver root is not in the CDI library's edits: %+v", m.Destination, m))
		}
	}

	var gotDevs map[string][]rspec.LinuxDevice
	if got.Linux != nil {
		gotDevs = map[string][]rspec.LinuxDevice{}
		for _, d := range got.Linux.Devices {
			gotDevs[d.Path] = append(gotDevs[d.Path], d)
		}
	}
	for p, ds := range gotDevs {
		if len(ds) > 1 {
			diffs = append(diffs, fmt.Sprintf("device node %s is there %d times: %+v", p, len(ds), ds))
		}
	}
	if want.Linux != nil {
		for _, w := range want.Linux.Devices {
			g := gotDevs[w.Path]
			if len(g) == 0 {
				diffs = append(diffs, fmt.Sprintf("device node %s (%s %d:%d) is missing", w.Path, w.Type, w.Major, w.Minor))
				continue
			}
			if g[0].Type != w.Type || g[0].Major != w.Major || g[0].Minor != w.Minor ||
				!sameMode(g[0].FileMode, w.FileMode) || !sameID(g[0].UID, w.UID) || !sameID(g[0].GID, w.GID) {
				diffs = append(diffs, fmt.Sprintf("device node %s: got %s, the CDI library makes %s", w.Path, devString(g[0]), devString(w)))
			}
		}
		if w := want.Linux.Resources; w != nil {
			for _, rule := range w.Devices {
				if !hasDeviceRule(got, rule) {
					var rules []string
					if got.Linux != nil && got.Linux.Resources != nil {
						for _, r := range got.Linux.Resources.Devices {
							rules = append(rules, ruleString(r))
						}
					}
					diffs = append(diffs, fmt.Sprintf("device cgroup rule %s is missing; the container's rules: %v", ruleString(rule), rules))
				}
			}
		}
	}

	gotEnv := map[string]bool{}
	if got.Process != nil {
		for _, e := range got.Process.Env {
			gotEnv[e] = true
		}
	}
	if want.Process != nil {
		for _, e := range want.Process.Env {
			if !gotEnv[e] {
				diffs = append(diffs, fmt.Sprintf("env %s is missing", e))
			}
		}
	}

	stages := func(h *rspec.Hooks) map[string][]rspec.Hook {
		if h == nil {
			return nil
		}
		return map[string][]rspec.Hook{
			"prestart": h.Prestart, "createRuntime": h.CreateRuntime, "createContainer": h.CreateContainer,
			"startContainer": h.StartContainer, "poststart": h.Poststart, "poststop": h.Poststop,
		}
	}
	gotHooks, wantHooks := stages(got.Hooks), stages(want.Hooks)
	for stage, ws := range wantHooks {
		gs := gotHooks[stage]
		i := 0
		for _, g := range gs {
			if i < len(ws) && sameHook(g, ws[i]) {
				i++
			}
		}
		if i < len(ws) {
			diffs = append(diffs, fmt.Sprintf("%s hook %v (and %d after it) is missing or out of order; got %s hooks %v",
				stage, ws[i].Args, len(ws)-i-1, stage, hookArgs(gs)))
		}
	}
	for stage, gs := range gotHooks {
		count := 0
		for _, g := range gs {
			if g.Path == f.Tools.Hook {
				count++
			}
		}
		if count != len(wantHooks[stage]) {
			diffs = append(diffs, fmt.Sprintf("%d %s hooks call the toolkit's hook, the CDI library makes %d: %v",
				count, stage, len(wantHooks[stage]), hookArgs(gs)))
		}
	}
	return diffs
}

// sameMode compares device node modes; none is runc's default, 0666.
func sameMode(a, b *os.FileMode) bool {
	if b == nil {
		return true
	}
	if a == nil {
		return *b == 0o666
	}
	return *a == *b
}

func sameID(a, b *uint32) bool {
	if b == nil {
		return true
	}
	return a != nil && *a == *b
}

func devString(d rspec.LinuxDevice) string {
	mode := "-"
	if d.FileMode != nil {
		mode = fmt.Sprintf("%o", *d.FileMode)
	}
	return fmt.Sprintf("%s %d:%d mode %s", d.Type, d.Major, d.Minor, mode)
}

func hasDeviceRule(s *rspec.Spec, want rspec.LinuxDeviceCgroup) bool {
	if s.Linux == nil || s.Linux.Resources == nil {
		return false
	}
	for _, r := range s.Linux.Resources.Devices {
		if r.Allow == want.Allow && r.Type == want.Type && eqPtr(r.Major, want.Major) && eqPtr(r.Minor, want.Minor) &&
			strings.Trim(want.Access, r.Access) == "" {
			return true
		}
	}
	return false
}

func eqPtr(a, b *int64) bool { return (a == nil && b == nil) || (a != nil && b != nil && *a == *b) }

func ruleString(r rspec.LinuxDeviceCgroup) string {
	v := func(p *int64) string {
		if p == nil {
			return "*"
		}
		return fmt.Sprint(*p)
	}
	return fmt.Sprintf("allow=%v %s %s:%s %s", r.Allow, r.Type, v(r.Major), v(r.Minor), r.Access)
}

func sameHook(a, b rspec.Hook) bool {
	return a.Path == b.Path && strings.Join(a.Args, "\x00") == strings.Join(b.Args, "\x00") &&
		strings.Join(a.Env, "\x00") == strings.Join(b.Env, "\x00") && eqIntPtr(a.Timeout, b.Timeout)
}

func eqIntPtr(a, b *int) bool { return (a == nil && b == nil) || (a != nil && b != nil && *a == *b) }

func hookArgs(hs []rspec.Hook) [][]string {
	var out [][]string
	for _, h := range hs {
		out = append(out, h.Args)
	}
	return out
}

// sha256File is the hex SHA-256 of a host file.
func sha256File(t *testing.T, path string) string {
	t.Helper()
	fh, err := os.Open(path)
	must(t, err)
	defer fh.Close()
	h := sha256.New()
	_, err = io.Copy(h, fh)
	must(t, err)
	return hex.EncodeToString(h.Sum(nil))
}

// mkdirAndCopy copies file src to dst, making dst's dir.
func mkdirAndCopy(dir, src, dst string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, 0o644)
}

// specDevices are the device nodes of an OCI spec (none without a linux section).
func specDevices(s *rspec.Spec) []rspec.LinuxDevice {
	if s.Linux == nil {
		return nil
	}
	return s.Linux.Devices
}
