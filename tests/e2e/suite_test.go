// Package e2e runs nri-accel inside real containerd, built from its Go modules by
// ../peers/build.sh, with runc and real containers. Every test starts its own containerd and its
// own nri-accel under a temp dir, and keeps their logs under the results dir when it fails.
package e2e

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"nri-accel/tests/internal/suite"
)

// The containerd versions of a plain run; NRI_ACCEL_E2E_CONTAINERD overrides (comma list).
const defaultVersions = "v1.7.0,v2.4.2"

// Versions of the whole matrix (tests/run.sh --matrix).
const matrixVersions = "v1.7.0,v1.7.35,v2.1.9,v2.2.9,v2.3.7,v2.4.2,crio-v1.36.3"

// The NRI version each containerd of the matrix vendors (its go.mod under tests/peers).
var nriOf = map[string]string{
	"v1.7.0": "v0.3.0", "v1.7.35": "v0.8.0", "v2.1.9": "v0.8.0", "v2.2.9": "v0.11.0", "v2.3.7": "v0.12.0", "v2.4.2": "v0.12.3",
	"crio-v1.36.3": "v0.11.0",
}

// pushesUpdates reports whether nri-accel sends UpdateContainers to runtime `version` between
// events (NRI v0.12.1 and newer). Before that, CPU moves of running containers travel only in
// the replies of the next CreateContainer, StopContainer or Synchronize (docs/operator-guide.md).
func pushesUpdates(version string) bool {
	var minor, patch int
	fmt.Sscanf(nriOf[version], "v0.%d.%d", &minor, &patch)
	return minor > 12 || minor == 12 && patch >= 1
}

// modes are the injection modes (nri.cdi_injection) tested on containerd `version`: cdi and
// device-nodes where NRI carries CDI device names in adjustments (v0.10 and newer); elsewhere
// device-nodes and auto (which must pick device nodes there).
func modes(version string) []string {
	var minor int
	fmt.Sscanf(nriOf[version], "v0.%d", &minor)
	if minor >= 10 {
		return []string{"cdi", "device-nodes"}
	}
	return []string{"device-nodes", "auto"}
}

// testsDir is the tests/ folder (the package runs in tests/e2e).
func testsDir() string { return suite.TestsDir() }

// requireRoot skips, loudly, when the suite cannot run: real containers need root.
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("SKIPPED: the real-containerd suite needs root (it runs containerd, runc and mknod); " +
			"run it as root, as CI does: sudo bash tests/run.sh")
	}
}

// versions are the containerd versions this run tests.
func versions() []string {
	if os.Getenv("NRI_ACCEL_E2E_CONTAINERD") == "matrix" {
		return strings.Split(matrixVersions, ",")
	}
	return suite.List("NRI_ACCEL_E2E_CONTAINERD", defaultVersions)
}

// peerBin is the bin dir of containerd `version` (or CRI-O, crio-<version>).
func peerBin(t *testing.T, version string) string {
	t.Helper()
	if isCrio(version) {
		return buildPeer(t, version)
	}
	return buildPeer(t, "containerd-"+version)
}

// buildPeer is the bin dir of peer `peer` (a dir under tests/peers), built (or found in the
// cache) by build.sh, which fails loudly on a missing module or a failed build.
func buildPeer(t *testing.T, peer string) string {
	t.Helper()
	dir, err := suite.BuildPeer(peer)
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// accelBin is the nri-accel binary under test: NRI_ACCEL_BIN, else the release build.
func accelBin(t *testing.T) string {
	t.Helper()
	bin, err := suite.AccelBin()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// resultsDir is where a failed test's logs are kept: NRI_ACCEL_E2E_RESULTS, else tests/results.
func resultsDir(t *testing.T) string {
	base := os.Getenv("NRI_ACCEL_E2E_RESULTS")
	if base == "" {
		base = filepath.Join(testsDir(), "results")
	}
	return filepath.Join(base, strings.ReplaceAll(t.Name(), "/", "_"))
}

// eachVersion runs f once per containerd version under test, as subtests named by the version.
func eachVersion(t *testing.T, f func(t *testing.T, version string)) {
	requireRoot(t)
	for _, v := range versions() {
		t.Run(v, func(t *testing.T) { f(t, v) })
	}
}

// eachVersionAndMode runs f per containerd version and per injection mode.
func eachVersionAndMode(t *testing.T, f func(t *testing.T, version, mode string)) {
	eachVersion(t, func(t *testing.T, v string) {
		if _, ok := nriOf[v]; !ok {
			t.Fatalf("containerd %s is not in the suite's matrix (tests/peers and nriOf)", v)
		}
		for _, m := range modes(v) {
			t.Run(m, func(t *testing.T) { f(t, v, m) })
		}
	})
}

// waitFor polls cond every 100 ms until it holds or `within` passes; it answers whether it held.
func waitFor(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// fileContains reports whether the file at path has a line containing s.
func fileContains(path, s string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		if strings.Contains(sc.Text(), s) {
			return true
		}
	}
	return false
}

// onlineCPUs answers the host's online CPUs as a list.
func onlineCPUs(t *testing.T) []int {
	b, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err != nil {
		t.Fatal(err)
	}
	cpus, err := parseCPUList(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return cpus
}

// parseCPUList reads a Linux CPU list ("0-3,6").
func parseCPUList(s string) ([]int, error) {
	var out []int
	if s == "" {
		return out, nil
	}
	for _, part := range strings.Split(s, ",") {
		var a, b int
		if n, _ := fmt.Sscanf(part, "%d-%d", &a, &b); n == 2 {
			for i := a; i <= b; i++ {
				out = append(out, i)
			}
			continue
		}
		if _, err := fmt.Sscanf(part, "%d", &a); err != nil {
			return nil, fmt.Errorf("bad CPU list %q", s)
		}
		out = append(out, a)
	}
	return out, nil
}

// cpusWithout answers the CPU list `all` without the CPUs of `minus`, as Linux writes it.
func cpusWithout(t *testing.T, all, minus string) string {
	a, err := parseCPUList(all)
	must(t, err)
	m, err := parseCPUList(minus)
	must(t, err)
	drop := map[int]bool{}
	for _, c := range m {
		drop[c] = true
	}
	var parts []string
	for i := 0; i < len(a); {
		if drop[a[i]] {
			i++
			continue
		}
		j := i
		for j+1 < len(a) && a[j+1] == a[j]+1 && !drop[a[j+1]] {
			j++
		}
		if j == i {
			parts = append(parts, fmt.Sprint(a[i]))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", a[i], a[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}
