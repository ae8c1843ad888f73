package cluster

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// The node's mount namespace. Mounts are private on this machine, so a volume the kubelet mounts
// (a ConfigMap, a service account token: tmpfs) would never reach a containerd outside the
// kubelet's mount namespace. The kubelet and containerd therefore both run in one namespace of
// their own, held by a process made with `unshare --mount` and entered with `nsenter`. In it:
//   - the kernel settings the kubelet insists on are files bound over /proc/sys (the machine's
//     own settings are never written);
//   - the kubelet's root dir is a shared mount already, as the kubelet wants it;
//   - the node's standard paths, the ones the shipped manifests hostPath-mount, are bound to the
//     cluster's own dirs (nodePaths), so the DaemonSet of packaging/kubernetes and the chart run
//     unchanged and everything they write lands under the cluster's temp dir.
// A path that did not exist on the machine is made for the bind (an empty dir) and removed again
// by the teardown.

// nodePaths maps each standard node path to its dir under the cluster's temp dir.
func (c *Cluster) nodePaths() map[string]string {
	paths := map[string]string{
		"/var/run/nri":                      filepath.Join(c.Dir, "nri"),
		"/var/run/cdi":                      c.CDIDir,
		"/var/lib/nri-accel":                c.StateDir,
		"/run/nri-accel":                    c.RunDir,
		"/var/lib/kubelet/plugins":          filepath.Join(c.KubeletDir, "plugins"),
		"/var/lib/kubelet/plugins_registry": filepath.Join(c.KubeletDir, "plugins_registry"),
		// The device plugin API fixes the kubelet's socket here whatever --root-dir says.
		devicePluginPath: filepath.Join(c.KubeletDir, "device-plugins"),
	}
	if c.NodeIP != "" {
		// A fleet's node sees its own fake devices at the path the fleet's one config names.
		paths[fleetDevDir] = c.Devs.Dir
	}
	return paths
}

// startNodeNamespace starts the holder of the node's mount namespace and waits until its binds
// are in place.
func (c *Cluster) startNodeNamespace(t *testing.T) {
	t.Helper()
	sysctls := filepath.Join(c.Dir, "sysctl")
	must(t, os.MkdirAll(sysctls, 0o755))
	var binds []string
	for k, v := range kubeletSysctls {
		f := filepath.Join(sysctls, strings.ReplaceAll(k, "/", "_"))
		must(t, os.WriteFile(f, []byte(v+"\n"), 0o644))
		binds = append(binds, fmt.Sprintf("mount --bind %s /proc/sys/%s", f, k))
	}
	// The kubelet makes its root dir a shared mount at start (a bind onto itself) while its
	// pod-resources server is renaming a socket into that dir: when the bind lands between the
	// socket's create and its rename, the rename fails with EXDEV and the kubelet exits. A root dir
	// that already is a shared mount is left alone, so the namespace makes it one beforehand.
	must(t, os.MkdirAll(c.KubeletDir, 0o755))
	binds = append(binds, fmt.Sprintf("mount --bind %[1]s %[1]s && mount --make-rshared %[1]s", c.KubeletDir))
	paths := c.nodePaths()
	targets := make([]string, 0, len(paths))
	for dst := range paths {
		targets = append(targets, dst)
	}
	sort.Strings(targets)
	for _, dst := range targets {
		must(t, os.MkdirAll(paths[dst], 0o755))
		// Remember what the bind's mount point makes on the machine (deepest last).
		var made []string
		for p := dst; p != "/"; p = filepath.Dir(p) {
			if _, err := os.Stat(p); os.IsNotExist(err) {
				made = append([]string{p}, made...)
			}
		}
		for _, m := range made {
			if !contains(c.madeDirs, m) {
				c.madeDirs = append(c.madeDirs, m)
			}
		}
		binds = append(binds, fmt.Sprintf("mkdir -p %s && mount --bind %s %s", dst, paths[dst], dst))
	}
	ready := filepath.Join(c.Dir, "node-namespace.ready")
	unshare := []string{"unshare", "--mount", "--propagation", "private"}
	if c.NodeIP != "" {
		// A fleet's node: a network namespace of its own too, with lo and the node's address
		// (fleet_test.go).
		unshare = append(unshare, "--net")
		binds = append([]string{"ip link set lo up", "ip link add eth0 type bridge",
			"ip addr add " + c.NodeIP + "/24 dev eth0", "ip link set eth0 up"}, binds...)
	}
	script := "set -e; " + strings.Join(binds, "; ") + "; touch " + ready + "; exec sleep 2147483647"
	c.NodeNS = startProc(t, "node-namespace", filepath.Join(c.Dir, "node-namespace.log"), nil,
		append(unshare, "--", "sh", "-c", script)...)
	if !waitFor(20*time.Second, func() bool {
		_, err := os.Stat(ready)
		return err == nil || !c.NodeNS.Running()
	}) || !c.NodeNS.Running() {
		t.Fatalf("the node's mount namespace did not come up:\n%s", tail(c.NodeNS.Log, 20))
	}
}

// inNode prefixes a command so that it runs in the node's mount namespace.
func (c *Cluster) inNode(args ...string) []string {
	return append([]string{"nsenter", fmt.Sprintf("--mount=/proc/%d/ns/mnt", c.NodeNS.cmd.Process.Pid), "--"}, args...)
}

// nodePath answers where a path of the node's mount namespace is seen from the machine (through
// the holder's root).
func (c *Cluster) nodePath(p string) string {
	return fmt.Sprintf("/proc/%d/root%s", c.NodeNS.cmd.Process.Pid, p)
}

// removeMadeDirs removes the empty dirs made on the machine for the binds, deepest first.
func (c *Cluster) removeMadeDirs() {
	sort.Slice(c.madeDirs, func(i, j int) bool { return len(c.madeDirs[i]) > len(c.madeDirs[j]) })
	for _, d := range c.madeDirs {
		if err := os.Remove(d); err != nil && !os.IsNotExist(err) {
			fmt.Fprintf(os.Stderr, "cluster teardown: %s left behind: %v\n", d, err)
		}
	}
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}
