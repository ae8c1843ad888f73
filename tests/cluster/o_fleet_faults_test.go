package cluster

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// accelContainerPID answers the pid of the nri-accel container on c's node (from runc's state).
func (c *Cluster) accelContainerPID(t *testing.T) int {
	t.Helper()
	pid := c.accelPID()
	if pid == 0 {
		t.Fatalf("no running nri-accel container on %s", c.node())
	}
	return pid
}

// accelPID answers the pid of the running nri-accel container on c's node, 0 when none runs.
func (c *Cluster) accelPID() int {
	root := filepath.Join(c.Dir, "containerd", "runc", "k8s.io")
	ids, _ := os.ReadDir(root)
	for _, id := range ids {
		out, err := exec.Command("runc", "--root", root, "state", id.Name()).Output()
		if err != nil {
			continue
		}
		var st struct {
			Pid         int               `json:"pid"`
			Status      string            `json:"status"`
			Annotations map[string]string `json:"annotations"`
		}
		if json.Unmarshal(out, &st) == nil && st.Status == "running" &&
			st.Annotations["io.kubernetes.cri.container-name"] == "nri-accel" &&
			st.Annotations["io.kubernetes.cri.sandbox-namespace"] == "nri-accel" {
			return st.Pid
		}
	}
	return 0
}

// Scenario o, node lost: a Deployment's two pods, one device each, on the last node (a
// preferred node affinity), whose kubelet and nri-accel are then killed (SIGKILL; containerd and
// the pods' containers live on). The node goes NotReady, the pods are evicted once their
// toleration of the unreachable taint ends (10 s in this cluster, fleetFlags) and their
// replacements run on the other nodes, which have free devices. The operator force-deletes one
// of the evicted pods, as one does for a node that may not come back: its claim is deallocated
// and deleted while the node is away, leaving the node an orphan to reconcile. When the kubelet
// comes back (and starts nri-accel's container again), both old containers are removed and both
// claims unprepared: no CDI spec, no held claim and nothing for `nri-accel reconcile` left on the
// node, and the replacements never restarted.
func scenarioFleetNodeLost(t *testing.T, f *fleet) {
	c := f.c
	lost := c.Nodes[len(c.Nodes)-1]
	node := lost.NodeName
	c.apply(strings.Replace(deploymentYAML("lost", 2, false), "    spec:\n", fmt.Sprintf("    spec:\n"+
		"      affinity: {nodeAffinity: {preferredDuringSchedulingIgnoredDuringExecution: [{weight: 100, preference: "+
		"{matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [%s]}]}}]}}\n", node), 1))
	pods := c.waitAppRunning(t, "lost", 2, 120*time.Second)
	var names, claims []string
	for _, p := range pods {
		if str(p, "spec", "nodeName") != node {
			t.Fatalf("pod %s runs on %s, not on %s its affinity prefers (which has %d free devices)",
				str(p, "metadata", "name"), str(p, "spec", "nodeName"), node, fleetWholeDevices)
		}
		names = append(names, str(p, "metadata", "name"))
		claims = append(claims, str(c.podClaims(t, p)["gpu"], "metadata", "name"))
	}
	if len(lost.specFiles()) != 2 {
		t.Fatalf("before the loss %s has specs %v, want those of %v", node, lost.specFiles(), names)
	}
	pid := lost.accelContainerPID(t)
	begin := time.Now()
	lost.Kubelet.Kill()
	must(t, syscall.Kill(pid, syscall.SIGKILL))
	if !waitFor(90*time.Second, func() bool { return !lost.nodeReady() }) {
		t.Fatalf("node %s still Ready 90 s after its kubelet was killed", node)
	}
	t.Logf("node %s NotReady %.1f s after its kubelet and nri-accel (pid %d) were killed", node, time.Since(begin).Seconds(), pid)
	moved := c.waitAppRunning(t, "lost", 2, 180*time.Second, node)
	t.Logf("pods %v replaced by %s on %s and %s on %s %.1f s after the kill", names,
		str(moved[0], "metadata", "name"), str(moved[0], "spec", "nodeName"),
		str(moved[1], "metadata", "name"), str(moved[1], "spec", "nodeName"), time.Since(begin).Seconds())
	for _, p := range moved {
		claimOnNode(t, c.podClaims(t, p)["gpu"], str(p, "spec", "nodeName"))
	}
	for _, name := range names {
		if p := c.pod(name); str(p, "metadata", "deletionTimestamp") == "" {
			t.Errorf("the lost node's pod %s is not being deleted: %v", name, field(p, "metadata"))
		}
	}
	// The operator gives one of them up: its claim goes while the node is away.
	c.kubectl("delete", "pod", names[0], "-n", "default", "--force", "--grace-period=0")
	if !waitFor(60*time.Second, func() bool {
		_, err := c.kubectlErr("get", "resourceclaim", claims[0], "-n", "default")
		return err != nil
	}) {
		t.Errorf("claim %s still there 60 s after its pod %s was force-deleted", claims[0], names[0])
	}
	if len(lost.specFiles()) != 2 {
		t.Errorf("while %s is lost its CDI specs are %v, want the lost pods' two (their containers still run)", node, lost.specFiles())
	}

	back := time.Now()
	lost.Kubelet.start(t)
	if !waitFor(120*time.Second, lost.nodeReady) {
		t.Fatalf("node %s not Ready 120 s after its kubelet started again:\n%s", node, tail(lost.Kubelet.Log, 30))
	}
	var left, steps []string
	specsLeft := 2
	if !waitFor(180*time.Second, func() bool {
		if n := len(lost.specFiles()); n != specsLeft {
			steps = append(steps, fmt.Sprintf("%d spec(s) at %.1f s", n, time.Since(back).Seconds()))
			specsLeft = n
		}
		left = nil
		for i, name := range names {
			if c.pod(name) != nil {
				left = append(left, "pod "+name)
			}
			if _, err := c.kubectlErr("get", "resourceclaim", claims[i], "-n", "default"); err == nil {
				left = append(left, "claim "+claims[i])
			}
		}
		if s := lost.specFiles(); len(s) > 0 {
			left = append(left, fmt.Sprintf("specs %v", s))
		}
		if st, err := lost.AccelStatus(); err != nil {
			left = append(left, "nri-accel status: "+err.Error())
		} else if h := list(st, "claims"); len(h) > 0 {
			left = append(left, fmt.Sprintf("held %v", h))
		}
		return len(left) == 0
	}) {
		t.Fatalf("180 s after %s came back, left: %v\nkubelet:\n%s", node, left, grepFile(lost.Kubelet.Log, "nprepare"))
	}
	t.Logf("%s back: the lost pods, their claims (one force-deleted while it was away) and their CDI specs gone %.1f s after its kubelet started again (%s)",
		node, time.Since(back).Seconds(), strings.Join(steps, ", "))
	c.waitFleetDeployed(t, nil, f.image)
	out, err := exec.Command(accelBin(t), "reconcile", "--dry-run", "--config", lost.AccelCfg).CombinedOutput()
	if err != nil || strings.Contains(string(out), "would ") || strings.Contains(string(out), "UNPROVEN") {
		t.Errorf("nri-accel reconcile --dry-run on %s after it came back: %v\n%s", node, err, out)
	}
	for _, m := range moved {
		if p := c.pod(str(m, "metadata", "name")); field(p, "status", "containerStatuses", 0, "restartCount") != float64(0) {
			t.Errorf("the replacement pod %s restarted: %v", str(m, "metadata", "name"), field(p, "status", "containerStatuses"))
		}
	}
	c.allHeld(t)
	c.noDeviceAllocatedTwice(t)
	c.kubectl("delete", "deployment", "lost", "-n", "default")
	c.waitNoSpecs(t, 90*time.Second)
}

// Scenario o, helm upgrade: a Deployment's pod holding a device on every node, then `helm
// upgrade` to a new image (the same image retagged in every node's containerd): the DaemonSet
// rolls node by node, and throughout every held claim's CDI spec stays as it was (checked every
// 50 ms), every pod keeps its container (restartCount 0) and its device node, and afterwards each
// new nri-accel holds its node's claim (from its checkpoint) and no device or claim is held twice.
func scenarioFleetUpgrade(t *testing.T, f *fleet) {
	c := f.c
	c.apply(deploymentYAML("held", len(c.Nodes), true))
	pods := c.waitAppRunning(t, "held", len(c.Nodes), 120*time.Second)
	type holder struct {
		name, node, container, uid, spec, body string
	}
	var holders []holder
	for _, p := range pods {
		h := holder{name: str(p, "metadata", "name"), node: str(p, "spec", "nodeName"),
			container: str(p, "status", "containerStatuses", 0, "containerID"),
			uid:       str(c.podClaims(t, p)["gpu"], "metadata", "uid")}
		n := c.fleetNode(h.node)
		specs := n.specFiles()
		if len(specs) != 1 {
			t.Fatalf("node %s has specs %v, want %s's", h.node, specs, h.name)
		}
		h.spec = filepath.Join(n.CDIDir, specs[0])
		b, err := os.ReadFile(h.spec)
		must(t, err)
		h.body = string(b)
		holders = append(holders, h)
	}
	old := map[string]string{}
	for node, p := range c.waitFleetDeployed(t, nil, f.image) {
		old[node] = str(p, "metadata", "uid")
	}
	var mu sync.Mutex
	var gone []string
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			for _, h := range holders {
				if b, err := os.ReadFile(h.spec); err != nil || string(b) != h.body {
					mu.Lock()
					gone = append(gone, h.node+"@"+time.Now().Format("15:04:05.000"))
					mu.Unlock()
				}
			}
		}
	}()

	// How many nodes lack a ready nri-accel at once while the DaemonSet rolls (its
	// maxUnavailable, 1 by default), and the order the nodes got their new pod in.
	var most int
	var order []string
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(300 * time.Millisecond):
			}
			out, err := c.kubectlErr("get", "pods", "-n", "nri-accel", "-l", "app.kubernetes.io/name=nri-accel", "-o", "json")
			var l obj
			if err != nil || json.Unmarshal([]byte(out), &l) != nil {
				continue
			}
			ready := map[string]bool{}
			for _, p := range list(l, "items") {
				node := str(p, "spec", "nodeName")
				if field(p, "status", "containerStatuses", 0, "ready") == true && str(p, "metadata", "deletionTimestamp") == "" {
					ready[node] = true
					if str(p, "metadata", "uid") != old[node] && !contains(order, node) {
						mu.Lock()
						order = append(order, node)
						mu.Unlock()
					}
				}
			}
			mu.Lock()
			most = max(most, len(c.Nodes)-len(ready))
			mu.Unlock()
		}
	}()

	next := f.version() + "-next"
	for _, n := range c.Nodes {
		var src string
		for _, ref := range strings.Fields(n.ctr(t, "images", "ls", "-q")) {
			if strings.HasSuffix(ref, "/nri-accel:"+f.version()) || ref == f.image {
				src = ref
			}
		}
		if src == "" {
			t.Fatalf("no image %s on %s", f.image, n.NodeName)
		}
		n.ctr(t, "images", "tag", src, strings.TrimSuffix(src, f.version())+next)
	}
	begin := time.Now()
	f.helm(t, "upgrade", "nri-accel", chartDir(), "--reuse-values", "--set", "image.tag="+next, "--wait", "--timeout", "5m")
	c.waitFleetDeployed(t, old, "nri-accel:"+next)
	t.Logf("helm upgrade to nri-accel:%s rolled across %d nodes in %.1f s", next, len(c.Nodes), time.Since(begin).Seconds())
	close(stop)
	<-done
	if len(gone) > 0 {
		t.Errorf("held claims' CDI specs were missing or changed at %d checks during the upgrade: %v", len(gone), gone)
	}
	mu.Lock()
	t.Logf("new pods seen ready (sampled every 0.3 s) on %v in that order; at most %d node(s) without a ready nri-accel at once", order, most)
	if most > 1 {
		t.Errorf("%d nodes were without a ready nri-accel at once during the upgrade, want at most 1 (the DaemonSet's maxUnavailable)", most)
	}
	mu.Unlock()
	c.noDeviceAllocatedTwice(t)
	held := c.allHeld(t)
	for _, h := range holders {
		p := c.pod(h.name)
		if str(p, "status", "phase") != "Running" || str(p, "status", "containerStatuses", 0, "containerID") != h.container ||
			field(p, "status", "containerStatuses", 0, "restartCount") != float64(0) {
			t.Errorf("after the upgrade %s is %s with container %s (restarts %v), want Running in %s", h.name, str(p, "status", "phase"),
				str(p, "status", "containerStatuses", 0, "containerID"), field(p, "status", "containerStatuses", 0, "restartCount"), h.container)
		}
		if _, ok := held[h.node][h.uid]; !ok || len(held[h.node]) != 1 {
			t.Errorf("after the upgrade nri-accel on %s holds %v, want only %s's claim %s", h.node, held[h.node], h.name, h.uid)
		}
		if out, err := c.fleetNode(h.node).ExecIn("default", h.name, "app", "sh", "-c", "ls "+fleetDevDir); err != nil || strings.TrimSpace(out) == "" {
			t.Errorf("after the upgrade %s sees no device under %s: %v %q", h.name, fleetDevDir, err, out)
		}
	}
	t.Logf("helm history:\n%s", f.helm(t, "history", "nri-accel"))
	c.kubectl("delete", "deployment", "held", "-n", "default")
	c.waitNoSpecs(t, 90*time.Second)
}
