package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// DeviceView is a device node as a process inside the container sees it.
type DeviceView struct {
	Type         string // "character special file"
	Major, Minor int64
	Mode         string // octal permission bits, e.g. "666"
	// Open is what opening it for reading says: "No such device or address" (ENXIO) when the
	// device cgroup lets it through (the fake major has no driver), "Operation not permitted"
	// when it does not.
	Open string
}

// viewDevice looks at path from inside container id (exec).
func (n *Node) viewDevice(t *testing.T, id, path string) (*DeviceView, error) {
	t.Helper()
	out, err := n.CRI.Exec(id, "stat", "-c", "%F|%t|%T|%a", path)
	if err != nil {
		return nil, err
	}
	f := strings.Split(strings.TrimSpace(out), "|")
	if len(f) != 4 {
		return nil, fmt.Errorf("stat of %s: %q", path, out)
	}
	major, _ := strconv.ParseInt(f[1], 16, 64)
	minor, _ := strconv.ParseInt(f[2], 16, 64)
	open, _ := n.CRI.Exec(id, "sh", "-c", "head -c1 "+path+" 2>&1 >/dev/null; true")
	return &DeviceView{Type: f[0], Major: major, Minor: minor, Mode: f[3], Open: strings.TrimSpace(open)}, nil
}

// cpusInside answers the CPUs a process in container id may run on (its cpuset).
func (n *Node) cpusInside(t *testing.T, id string) string {
	t.Helper()
	out, err := n.CRI.Exec(id, "grep", "Cpus_allowed_list", "/proc/self/status")
	if err != nil {
		t.Fatalf("reading the cpuset inside %s: %v", id, err)
	}
	f := strings.Fields(out)
	if len(f) != 2 {
		t.Fatalf("Cpus_allowed_list inside %s: %q", id, out)
	}
	return f[1]
}

// envInside answers the environment of container id's processes.
func (n *Node) envInside(t *testing.T, id string) map[string]string {
	t.Helper()
	out, err := n.CRI.Exec(id, "env")
	if err != nil {
		t.Fatalf("env inside %s: %v", id, err)
	}
	env := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			env[k] = v
		}
	}
	return env
}

// claimOf answers the annotation-path claim of container id, if status has one.
func claimOf(st Status, id string) map[string]any {
	for _, c := range st.Claims() {
		if origin, ok := c["origin"].(map[string]any); ok && origin["container_id"] == id {
			return c
		}
	}
	return nil
}

// deviceIDs answers the device ids of a claim's results.
func deviceIDs(claim map[string]any) []string {
	var out []string
	results, _ := claim["results"].([]any)
	for _, r := range results {
		if id, ok := r.(map[string]any)["device_id"].(string); ok {
			out = append(out, id)
		}
	}
	sort.Strings(out)
	return out
}

// assertNothingHeld checks that no claim, held unit or spec file is left.
func (n *Node) assertNothingHeld(t *testing.T) {
	t.Helper()
	st := n.status(t)
	if c := st.Claims(); len(c) != 0 {
		t.Errorf("claims left: %v", c)
	}
	if h := st.Held(); len(h) != 0 {
		t.Errorf("units left held: %v", h)
	}
	if f := n.Accel.SpecFiles(); len(f) != 0 {
		t.Errorf("CDI spec files left in %s: %v", n.Accel.CDIDir, f)
	}
}

// assertNoDoubleGrant checks nri-accel's status (each whole device held at most once) and what
// runs: no device node given to two running containers of an exclusive pool, no exclusive CPU in
// two device holders' cpusets. holders maps container id to the device index it should hold.
func (n *Node) assertNoDoubleGrant(t *testing.T) {
	t.Helper()
	st := n.status(t)
	for dev, claims := range st.Held() {
		if strings.HasPrefix(dev, "accel") && len(claims) > 1 {
			t.Errorf("exclusive device %s held by %d claims: %v", dev, len(claims), claims)
		}
	}
	// What containerd gave the running containers.
	ctrs, err := n.CRI.Containers()
	if err != nil {
		t.Fatalf("ListContainers: %v", err)
	}
	byNode := map[string][]string{}
	for _, c := range ctrs {
		if c.State != 1 { // CONTAINER_RUNNING
			continue
		}
		spec, err := n.CRI.ContainerSpec(c.Id)
		if err != nil {
			continue // gone meanwhile
		}
		for _, d := range spec.Linux.Devices {
			if d.Major == int64(n.Devs.Major) && d.Minor < int64(wholeDevices(n)) {
				byNode[filepath.Base(d.Path)] = append(byNode[filepath.Base(d.Path)], c.Id)
			}
		}
	}
	for node, ids := range byNode {
		if len(ids) > 1 {
			t.Errorf("exclusive device node %s is in %d running containers: %v", node, len(ids), ids)
		}
	}
}

// wholeDevices is how many devices of pool whole the node's config has.
func wholeDevices(n *Node) int {
	b, _ := os.ReadFile(n.Accel.Config)
	return strings.Count(string(b), "- id: accel")
}
