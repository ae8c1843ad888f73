package cluster

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// A fleet: several real nodes on one machine (Options.Nodes > 1; issue 37). One control plane
// (etcd, kube-apiserver, kube-controller-manager, kube-scheduler on the machine's loopback), and
// per node, fleet-1 .. fleet-N:
//   - a holder of the node's mount namespace (nodens_test.go) that also holds a network
//     namespace of its own: lo, and eth0 (a bridge with no ports, as the pod network uses; this
//     kernel has no dummy links) holding the node's address 10.201.0.<i+2>/24, the Node's
//     InternalIP (the kubelet's --node-ip);
//   - in the network namespace, a listener on the apiserver's loopback address and port that
//     forwards to the machine's apiserver, so the node's kubelet and containerd reach it as the
//     single node does (the same kubeconfig server) while nothing else of the machine's network
//     is theirs;
//   - a containerd and a kubelet of its own in those namespaces, under <cluster dir>/node-<i+1>
//     (the first node uses the cluster dir itself, as the single node does), with the node's
//     standard paths (/var/run/nri, /var/run/cdi, /var/lib/nri-accel, /run/nri-accel, the kubelet's
//     plugin dirs) bound to its own dirs, a kubelet client and serving certificate of its own
//     (system:node:<name>), and pods addressed from 10.<244+i>.0.0/16 by the suite's pod network;
//   - its own fake devices (mkDevices), seen at fleetDevDir in its mount namespace, so one
//     config (the chart's values) names every node's devices by the same paths while each node's
//     device nodes are its own files.
// No nri-accel runs on the machine: the fleet's tests install the chart, the image imported into
// every node's containerd, on the nodes labelled accel.nri.io/enabled=true.
//
// What a fleet lacks: the apiserver cannot reach a kubelet (the nodes' addresses are not routed
// from the machine), so `kubectl logs` and `kubectl exec` do not work; the suite reads logs from
// the files and execs through each node's CRI (ExecIn), as the single node's scenarios do.

// fleetDevDir is where each fleet node sees its own fake devices.
const fleetDevDir = "/dev/nri-accel-fleet"

// fleetWholeDevices is how many devices pool `whole` has on each fleet node.
const fleetWholeDevices = 2

// fleetFlags are the flags a fleet adds to component (none on a single node). The timeouts
// that make a lost node's pods move within about 30 s: the node controller declares a node
// NotReady 20 s after its last heartbeat (default 50 s) and checks every 2 s (default 5 s); the
// apiserver gives every pod 10 s of toleration of the not-ready and unreachable taints (default
// 300 s). And the apiserver's audit log, <cluster dir>/audit.log (auditPolicy), from which
// requestsByNode counts each node's requests.
func (c *Cluster) fleetFlags(component string) []string {
	if c.Opts.Nodes < 2 {
		return nil
	}
	switch component {
	case "kube-apiserver":
		policy := filepath.Join(c.Dir, "audit-policy.yaml")
		if err := os.WriteFile(policy, []byte(auditPolicy), 0o644); err != nil {
			c.t.Fatal(err)
		}
		return []string{"--default-not-ready-toleration-seconds=10", "--default-unreachable-toleration-seconds=10",
			"--audit-policy-file=" + policy, "--audit-log-path=" + c.auditLog(), "--audit-log-maxsize=200",
			"--audit-log-maxbackup=1", "--audit-log-format=json"}
	case "kube-controller-manager":
		return []string{"--node-monitor-period=2s", "--node-monitor-grace-period=20s"}
	}
	return nil
}

// startFleet starts the fleet's nodes (c being the first) and waits until each is Ready.
func (c *Cluster) startFleet(t *testing.T, ctrdBin string) {
	t.Helper()
	for i := 0; i < c.Opts.Nodes; i++ {
		begin := time.Now()
		n := c
		if i > 0 {
			dir := filepath.Join(c.Dir, fmt.Sprintf("node-%d", i+1))
			p := *c.pki
			p.dir = filepath.Join(dir, "pki")
			must(t, os.MkdirAll(p.dir, 0o700))
			n = &Cluster{Version: c.Version, Dir: dir, KubeBin: c.KubeBin, pki: &p, Server: c.Server, Admin: c.Admin,
				Gates: c.Gates, Opts: c.Opts, control: c, t: t}
			n.KubeletDir = filepath.Join(dir, "kubelet")
			n.CDIDir = filepath.Join(dir, "cdi")
			n.AccelDir = filepath.Join(dir, "nri-accel")
			n.StateDir, n.RunDir = filepath.Join(n.AccelDir, "state"), filepath.Join(n.AccelDir, "run")
			t.Cleanup(n.Teardown)
		}
		n.NodeName = fmt.Sprintf("fleet-%d", i+1)
		n.NodeIP = fmt.Sprintf("10.201.0.%d", i+2)
		n.podSubnet = fmt.Sprintf("10.%d.", 244+i)
		n.Devs = mkDevices(t, fleetWholeDevices)
		n.startNodeNamespace(t)
		n.forwardAPIServer(t)
		n.startContainerd(t, ctrdBin)
		n.startKubelet(t)
		c.Nodes = append(c.Nodes, n)
		t.Logf("node %s (%s) Ready in %.1f s", n.NodeName, n.NodeIP, time.Since(begin).Seconds())
	}
}

// forwardAPIServer serves the apiserver's address inside the node's network namespace.
func (c *Cluster) forwardAPIServer(t *testing.T) {
	t.Helper()
	addr := strings.TrimPrefix(c.Server, "https://")
	l, err := listenIn(fmt.Sprintf("/proc/%d/ns/net", c.NodeNS.cmd.Process.Pid), addr)
	if err != nil {
		t.Fatalf("the apiserver's address in node %s's network namespace: %v", c.node(), err)
	}
	c.forwards = append(c.forwards, l)
	go (&podNet{apiserver: addr}).forward(l)
}

// fleetNode answers the fleet's node named name (nil when none is).
func (c *Cluster) fleetNode(name string) *Cluster {
	for _, n := range c.Nodes {
		if n.NodeName == name {
			return n
		}
	}
	return nil
}

// fleetInventory is the config's discovery and pools sections every fleet node runs with (the
// chart's values): pool `whole`, exclusive, fleetWholeDevices devices at fleetDevDir. No
// NUMA-local CPUs are reserved: every node's kubelet sees the same two CPUs of the machine.
func (c *Cluster) fleetInventory(t *testing.T) string {
	t.Helper()
	cpus, err := os.ReadFile("/sys/devices/system/cpu/online")
	must(t, err)
	var b strings.Builder
	fmt.Fprintf(&b, "discovery:\n  sysfs: false\n  cpus: %q\n  static_devices:\n", strings.TrimSpace(string(cpus)))
	var ids []string
	for i := 0; i < fleetWholeDevices; i++ {
		id := fmt.Sprintf("accel%d", i)
		ids = append(ids, id)
		fmt.Fprintf(&b, "    - id: %s\n      vendor: e2e\n      model: fake\n      numa_node: 0\n      memory_mib: 16384\n"+
			"      compute_units: 8\n      nodes:\n        - { path: %s/%s, major: %d, minor: %d }\n",
			id, fleetDevDir, filepath.Base(c.Devs.Path(i)), c.Devs.Major, i)
	}
	fmt.Fprintf(&b, "pools:\n  - name: whole\n    select: { ids: [%s] }\n    family: { kind: exclusive }\n    cpus_per_device: 0\n",
		strings.Join(ids, ", "))
	return b.String()
}

// fleetImage builds the image with packaging/image.sh from the binary under test, imports it
// into every node's containerd and answers its name (nri-accel:<version>).
func (c *Cluster) fleetImage(t *testing.T) string {
	t.Helper()
	image := c.importImage(t)
	archives, _ := filepath.Glob(filepath.Join(c.Dir, "image", "nri-accel-*-oci.tar"))
	for _, n := range c.Nodes[1:] {
		n.ctr(t, "images", "import", archives[0])
	}
	return image
}

// ctr runs containerd's ctr against the node's containerd, in the k8s.io namespace.
func (c *Cluster) ctr(t *testing.T, args ...string) string {
	t.Helper()
	bin := filepath.Join(buildPeer(t, containerdPeer), "ctr")
	out, err := exec.Command(bin, append([]string{"--address", c.CRISocket, "-n", "k8s.io"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("ctr %s on node %s: %v\n%s", strings.Join(args, " "), c.node(), err, out)
	}
	return string(out)
}

// fleetNodes answers NRI_ACCEL_CLUSTER_NODES (default def, at least 2).
func fleetNodes(t *testing.T, def int) int {
	n := def
	if v := os.Getenv("NRI_ACCEL_CLUSTER_NODES"); v != "" {
		if _, err := fmt.Sscanf(v, "%d", &n); err != nil || n < 2 {
			t.Fatalf("NRI_ACCEL_CLUSTER_NODES=%q: want a number of nodes, 2 or more", v)
		}
	}
	return n
}

// auditPolicy records every request at the Metadata level once it is answered (who, with which
// user agent, which verb on which resource, the response code), without bodies: enough to count
// a node's requests by kind (issue 37 item 4), small enough to keep for a whole run.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
`

// auditLog is the fleet apiserver's audit log.
func (c *Cluster) auditLog() string { return filepath.Join(c.Dir, "audit.log") }

// nodeCost answers what the node's processes on the machine take, by program: their resident
// memory now and the CPU time they used since they started (user and system; a process gone,
// such as a killed nri-accel, no longer counts). The node's processes are its containerd, kubelet
// and containerd shims (every process whose command line names the node's dir) and nri-accel in
// its container; the control plane is not counted.
func (c *Cluster) nodeCost(t *testing.T) string {
	t.Helper()
	by := map[string]int{}
	ticks := map[string]int{}
	var others []string
	if c.control == nil {
		for _, n := range c.Nodes[1:] {
			others = append(others, n.Dir+"/")
		}
	}
	procs, _ := os.ReadDir("/proc")
	accel := c.accelPID()
	for _, p := range procs {
		var pid int
		if _, err := fmt.Sscanf(p.Name(), "%d", &pid); err != nil {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		args := strings.Split(string(cmdline), "\x00")
		mine := pid == accel || strings.Contains(string(cmdline), c.Dir+"/")
		for _, o := range others {
			mine = mine && !strings.Contains(string(cmdline), o)
		}
		if !mine || len(args) == 0 {
			continue
		}
		status, _ := os.ReadFile(filepath.Join("/proc", p.Name(), "status"))
		var kb int
		for _, l := range strings.Split(string(status), "\n") {
			if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
				fmt.Sscanf(strings.TrimSpace(v), "%d", &kb)
			}
		}
		name := filepath.Base(args[0])
		if pid == accel {
			name = "nri-accel"
		} else if contains([]string{"nsenter", "sh", "sleep", "unshare", "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"}, name) {
			// The node namespace's holder, and the control plane (its files are in the first
			// node's dir).
			continue
		}
		by[name] += kb
		// utime and stime, fields 14 and 15 of stat, in clock ticks (100 a second).
		if stat, err := os.ReadFile(filepath.Join("/proc", p.Name(), "stat")); err == nil {
			if i := strings.LastIndexByte(string(stat), ')'); i > 0 {
				f := strings.Fields(string(stat)[i+1:])
				var u, s int
				if len(f) > 12 {
					fmt.Sscanf(f[11], "%d", &u)
					fmt.Sscanf(f[12], "%d", &s)
				}
				ticks[name] += u + s
			}
		}
	}
	total, cpu := 0, 0
	var parts []string
	for name, kb := range by {
		total += kb
		cpu += ticks[name]
		parts = append(parts, fmt.Sprintf("%s %d MiB %.1f s", name, kb/1024, float64(ticks[name])/100))
	}
	sort.Strings(parts)
	return fmt.Sprintf("%d MiB resident, %.1f s of CPU (%s)", total/1024, float64(cpu)/100, strings.Join(parts, ", "))
}
