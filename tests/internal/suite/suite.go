// Package suite holds what the real-peer suites (e2e: containerd and CRI-O; cluster: Kubernetes)
// both need before a test starts or after it ends: where tests/ is, the peers built by
// tests/peers/build.sh, the nri-accel binary under test, list-valued settings from the
// environment, and the detaching of mounts a test left. Each suite wraps these in its own
// helpers that fail its test.
package suite

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"syscall"
)

// TestsDir is the repository's tests/ folder.
func TestsDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(filepath.Dir(file)))
}

// List reads a comma-separated list from the environment variable name, or from def when it
// is unset or empty; empty items are dropped.
func List(name, def string) []string {
	v := os.Getenv(name)
	if v == "" {
		v = def
	}
	var out []string
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

var (
	peerMu   sync.Mutex
	peerBins = map[string]string{}
)

// BuildPeer is the bin dir of peer (a dir under tests/peers, e.g. containerd-v2.4.2), built by
// tests/peers/build.sh or found in its cache; asked once per peer and process.
func BuildPeer(peer string) (string, error) {
	peerMu.Lock()
	defer peerMu.Unlock()
	if dir, ok := peerBins[peer]; ok {
		return dir, nil
	}
	cmd := exec.Command("bash", filepath.Join(TestsDir(), "peers", "build.sh"), peer)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("building peer %s failed: %v\n%s", peer, err, stderr.String())
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == peer {
			peerBins[peer] = f[1]
			return f[1], nil
		}
	}
	return "", fmt.Errorf("build.sh named no bin dir for %s: %q", peer, out)
}

// AccelBin is the nri-accel binary under test: NRI_ACCEL_BIN, else the release build.
func AccelBin() (string, error) {
	bin := os.Getenv("NRI_ACCEL_BIN")
	if bin == "" {
		bin = filepath.Join(TestsDir(), "..", "target", "release", "nri-accel")
	}
	abs, err := filepath.Abs(bin)
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(abs); err != nil {
		return "", fmt.Errorf("no nri-accel binary at %s (set NRI_ACCEL_BIN or cargo build --release -p nri-accel): %v", abs, err)
	}
	return abs, nil
}

// UnmountUnder detaches every mount at or below dir, deepest first.
func UnmountUnder(dir string) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return
	}
	defer f.Close()
	var points []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && (fields[4] == dir || strings.HasPrefix(fields[4], dir+"/")) {
			points = append(points, fields[4])
		}
	}
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	for _, p := range points {
		_ = syscall.Unmount(p, syscall.MNT_DETACH)
	}
}
