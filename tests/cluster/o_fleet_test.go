package cluster

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Scenario o, a fleet (issue 37): nri-accel installed with the Helm chart, as an operator
// installs it, on every node of a several-node cluster (fleet_test.go), then what a fleet's
// scheduler and operators do to it. By default (tests/cluster.sh test, .ci/run) two nodes and
// the scenarios placement and drain; NRI_ACCEL_CLUSTER_FLEET=full runs every scenario on
// NRI_ACCEL_CLUSTER_NODES nodes (default 3). tests/README.md, "The cluster suite", says what each
// proves.
func TestClusterFleet(t *testing.T) {
	requireRoot(t)
	full := os.Getenv("NRI_ACCEL_CLUSTER_FLEET") == "full"
	nodes := 2
	if full {
		nodes = fleetNodes(t, 3)
	}
	for _, v := range kubeVersions() {
		t.Run(v, func(t *testing.T) {
			start := time.Now()
			c := Start(t, v, Options{Nodes: nodes, NoHostAccel: true})
			t.Logf("fleet of %d nodes on %s up in %.1f s", nodes, v, time.Since(start).Seconds())
			f := installFleet(t, c)
			all := []scenario{
				{"placement", f.run(scenarioFleetPlacement)},
				{"drain", f.run(scenarioFleetDrain)},
			}
			if full {
				all = append(all,
					scenario{"node_lost", f.run(scenarioFleetNodeLost)},
					scenario{"helm_upgrade_rolls", f.run(scenarioFleetUpgrade)},
					scenario{"webhook_judges_the_fleet", f.run(scenarioFleetWebhook)},
				)
			}
			runScenarios(t, c, false, all...)
			for _, n := range c.Nodes {
				n.t = t
			}
			t.Logf("requests per node (the apiserver's audit log, since the chart's install):\n%s", c.requestsByNode(t, f.installed))
		})
	}
}

// fleet is what the fleet's scenarios share.
type fleet struct {
	c         *Cluster
	image     string // nri-accel:<version>, as installed
	values    string // the chart's values file: the nodes' inventory
	installed time.Time
}

// run adapts a fleet scenario to runScenarios: every node's failures go to the running subtest.
func (f *fleet) run(s func(t *testing.T, f *fleet)) func(t *testing.T, c *Cluster) {
	return func(t *testing.T, c *Cluster) {
		for _, n := range c.Nodes {
			n.t = t
		}
		s(t, f)
	}
}

// installFleet imports the image into every node, labels every node accel.nri.io/enabled=true
// and installs the chart with the nodes' inventory as values, then waits until nri-accel is up
// on every node.
func installFleet(t *testing.T, c *Cluster) *fleet {
	t.Helper()
	begin := time.Now()
	f := &fleet{c: c, image: c.fleetImage(t), values: filepath.Join(c.Dir, "fleet-values.yaml")}
	t.Logf("image %s built and imported into %d nodes in %.1f s", f.image, len(c.Nodes), time.Since(begin).Seconds())
	inventory := c.fleetInventory(t)
	must(t, os.WriteFile(f.values, []byte(inventory), 0o644))
	for _, n := range c.Nodes {
		n.writeHostViewConfig(t, inventory)
		c.kubectl("label", "node", n.NodeName, "accel.nri.io/enabled=true")
	}
	f.installed = time.Now()
	f.helm(t, "install", "nri-accel", chartDir(), "--create-namespace", "--set", "image.tag="+f.version(), "-f", f.values,
		"--wait", "--timeout", "5m")
	c.waitFleetDeployed(t, nil, f.image)
	t.Logf("the chart installed and nri-accel up on %d nodes in %.1f s", len(c.Nodes), time.Since(f.installed).Seconds())
	for _, n := range c.Nodes {
		t.Logf("node %s, resident memory: %s", n.NodeName, n.nodeMemory(t))
	}
	c.apply(claimTemplateYAML("fleet-one", oneDevice("accel-gpu", "", "")))
	return f
}

func (f *fleet) version() string { return strings.TrimPrefix(f.image, "nri-accel:") }

// helm runs helm in the release's namespace; a failure fails the test.
func (f *fleet) helm(t *testing.T, args ...string) string {
	t.Helper()
	begin := time.Now()
	out, err := f.c.helm(t, append(args, "--namespace", "nri-accel")...)
	if err != nil {
		o, _ := f.c.kubectlErr("get", "pods", "-A", "-o", "wide")
		t.Fatalf("%v\n%s", err, o)
	}
	t.Logf("helm %s: %.1f s", args[0], time.Since(begin).Seconds())
	return out
}

// waitFleetDeployed waits until every node runs one ready nri-accel pod of image whose UID is
// not the node's in old, and the daemon in it has its gate open, its DRA driver registered by
// the node's kubelet and devices published. It answers the pods by node.
func (c *Cluster) waitFleetDeployed(t *testing.T, old map[string]string, image string) map[string]obj {
	t.Helper()
	var by map[string]obj
	var why string
	if !waitFor(300*time.Second, func() bool {
		by = map[string]obj{}
		for _, p := range c.accelPods(t) {
			if str(p, "metadata", "deletionTimestamp") == "" {
				by[str(p, "spec", "nodeName")] = p
			}
		}
		for _, n := range c.Nodes {
			p := by[n.NodeName]
			switch {
			case p == nil:
				why = "no pod on " + n.NodeName
			case old != nil && str(p, "metadata", "uid") == old[n.NodeName]:
				why = "the old pod still on " + n.NodeName
			case !strings.HasSuffix(str(p, "spec", "containers", 0, "image"), image):
				why = fmt.Sprintf("pod of image %s on %s", str(p, "spec", "containers", 0, "image"), n.NodeName)
			case field(p, "status", "containerStatuses", 0, "ready") != true:
				why = "pod not ready on " + n.NodeName
			default:
				st, err := n.AccelStatus()
				if err != nil {
					why = fmt.Sprintf("status on %s: %v", n.NodeName, err)
					return false
				}
				devices := 0.0
				for _, s := range list(st, "kubernetes", "resource_slices", "slices") {
					d, _ := field(s, "devices").(float64)
					devices += d
				}
				if field(st, "gate", "open") != true || str(st, "kubernetes", "resource_slices", "state") != "published" ||
					str(st, "kubelet", "dra", "registration") != "registered" || devices == 0 {
					why = fmt.Sprintf("nri-accel on %s: gate %v, slices %s, registration %s, devices %v", n.NodeName,
						field(st, "gate", "open"), str(st, "kubernetes", "resource_slices", "state"),
						str(st, "kubelet", "dra", "registration"), devices)
					return false
				}
				continue
			}
			return false
		}
		return true
	}) {
		out, _ := c.kubectlErr("get", "pods", "-n", "nri-accel", "-o", "wide")
		t.Fatalf("nri-accel is not up on every node (%s):\n%s", why, out)
	}
	return by
}

// fleetPodSpec is a pod spec (indented for a pod or a Deployment's template by ind) of the suite's
// image whose container app sleeps, holding one device per claim of template fleet-one named in
// claims. Host network, no service account token, and no toleration beyond the defaults: a
// drained or lost node's pods leave it.
func fleetPodSpec(ind string, claims ...string) string {
	var rc, uses []string
	for _, n := range claims {
		rc = append(rc, fmt.Sprintf("{name: %s, resourceClaimTemplateName: fleet-one}", n))
		uses = append(uses, fmt.Sprintf("{name: %s}", n))
	}
	s := fmt.Sprintf(`hostNetwork: true
automountServiceAccountToken: false
enableServiceLinks: false
terminationGracePeriodSeconds: 1
resourceClaims: [%s]
containers:
  - name: app
    image: %s
    imagePullPolicy: Never
    command: [sleep, "1000000"]
    resources: {claims: [%s]}
`, strings.Join(rc, ", "), imageRef, strings.Join(uses, ", "))
	return ind + strings.ReplaceAll(strings.TrimSuffix(s, "\n"), "\n", "\n"+ind) + "\n"
}

// fleetPodYAML is a pod in namespace default holding one device per claim.
func fleetPodYAML(name string, claims ...string) string {
	return fmt.Sprintf("apiVersion: v1\nkind: Pod\nmetadata: {name: %s, namespace: default}\nspec:\n%s", name, fleetPodSpec("  ", claims...))
}

// deploymentYAML is a Deployment of replicas pods holding one device each; with spread, at most
// one of its pods per node (a topology spread constraint the scheduler must keep).
func deploymentYAML(name string, replicas int, spread bool) string {
	extra := ""
	if spread {
		extra = fmt.Sprintf("      topologySpreadConstraints:\n        - {maxSkew: 1, topologyKey: kubernetes.io/hostname, "+
			"whenUnsatisfiable: DoNotSchedule, labelSelector: {matchLabels: {app: %s}}}\n", name)
	}
	return fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata: {name: %[1]s, namespace: default}
spec:
  replicas: %[2]d
  selector: {matchLabels: {app: %[1]s}}
  template:
    metadata: {labels: {app: %[1]s}}
    spec:
%[3]s%[4]s`, name, replicas, extra, fleetPodSpec("      ", "gpu"))
}

// pods answers the pods of namespace default labelled app=<app> that are not being deleted.
func (c *Cluster) appPods(t *testing.T, app string) []obj {
	t.Helper()
	var out []obj
	for _, p := range list(c.getJSON(t, "get", "pods", "-n", "default", "-l", "app="+app), "items") {
		if m := p.(map[string]any); str(m, "metadata", "deletionTimestamp") == "" {
			out = append(out, m)
		}
	}
	return out
}

// waitAppRunning waits until app has n running and ready pods, none on a node of avoid, and
// answers them.
func (c *Cluster) waitAppRunning(t *testing.T, app string, n int, within time.Duration, avoid ...string) []obj {
	t.Helper()
	var pods []obj
	if !waitFor(within, func() bool {
		pods = nil
		for _, p := range c.appPods(t, app) {
			if str(p, "status", "phase") == "Running" && field(p, "status", "containerStatuses", 0, "ready") == true &&
				!contains(avoid, str(p, "spec", "nodeName")) {
				pods = append(pods, p)
			}
		}
		return len(pods) == n
	}) {
		out, _ := c.kubectlErr("get", "pods,resourceclaims", "-n", "default", "-o", "wide")
		t.Fatalf("%s has %d running pods off %v within %s, want %d:\n%s", app, len(pods), avoid, within, n, out)
	}
	return pods
}

// podClaims answers the ResourceClaims behind the pod's claims, by the pod's claim name.
func (c *Cluster) podClaims(t *testing.T, p obj) map[string]obj {
	t.Helper()
	out := map[string]obj{}
	for _, s := range list(p, "status", "resourceClaimStatuses") {
		out[str(s, "name")] = c.getJSON(t, "get", "resourceclaim", str(s, "resourceClaimName"), "-n", "default")
	}
	return out
}

// claimOnNode checks that claim is allocated devices of the pod's node only (nri-accel's pool is
// named after its node) and answers them.
func claimOnNode(t *testing.T, claim obj, node string) []string {
	t.Helper()
	devs := allocatedDevices(claim)
	if len(devs) == 0 {
		t.Errorf("claim %s is not allocated", str(claim, "metadata", "name"))
	}
	for _, d := range devs {
		if !strings.HasPrefix(d, "accel.nri.io/"+node+"/") {
			t.Errorf("claim %s of a pod on %s is allocated %s", str(claim, "metadata", "name"), node, d)
		}
	}
	return devs
}

// allHeld answers every node's held claims (nri-accel status) by node, and fails the test when
// a device is held by two claims or a claim by two nodes.
func (c *Cluster) allHeld(t *testing.T) map[string]map[string][]string {
	t.Helper()
	out := map[string]map[string][]string{}
	where := map[string]string{}
	for _, n := range c.Nodes {
		out[n.NodeName] = n.noDeviceHeldTwice(t)
		for uid := range out[n.NodeName] {
			if other, ok := where[uid]; ok {
				t.Errorf("claim %s is held on %s and on %s", uid, other, n.NodeName)
			}
			where[uid] = n.NodeName
		}
	}
	return out
}

// noDeviceAllocatedTwice fails the test when two ResourceClaims of the cluster are allocated one
// device (the scheduler's side of "granted twice"; allHeld checks the nodes' side).
func (c *Cluster) noDeviceAllocatedTwice(t *testing.T) {
	t.Helper()
	by := map[string]string{}
	for _, cl := range list(c.getJSON(t, "get", "resourceclaims", "-A"), "items") {
		for _, d := range allocatedDevices(cl.(map[string]any)) {
			name := str(cl, "metadata", "name")
			if other, ok := by[d]; ok {
				t.Errorf("device %s is allocated to claims %s and %s", d, other, name)
			}
			by[d] = name
		}
	}
}

// waitNoSpecs waits until no node has a CDI spec or a held claim.
func (c *Cluster) waitNoSpecs(t *testing.T, within time.Duration) {
	t.Helper()
	var left []string
	if !waitFor(within, func() bool {
		left = nil
		for _, n := range c.Nodes {
			if s := n.specFiles(); len(s) > 0 {
				left = append(left, fmt.Sprintf("%s: specs %v", n.NodeName, s))
			}
			if h := n.heldClaims(t); len(h) > 0 {
				left = append(left, fmt.Sprintf("%s: held %v", n.NodeName, h))
			}
		}
		return len(left) == 0
	}) {
		t.Errorf("left on the nodes %s after their pods went: %v", within, left)
	}
}

// Scenario o, placement: one pod per node plus one, each with two claims of one device; each
// node has two devices. The scheduler places each pod with both its claims on one node, every
// node gets one pod, no device is allocated twice, and the last pod stays Pending; each node's
// nri-accel holds exactly the claims of the pod on it.
func scenarioFleetPlacement(t *testing.T, f *fleet) {
	c := f.c
	var yamls []string
	for i := 0; i <= len(c.Nodes); i++ {
		yamls = append(yamls, fleetPodYAML(fmt.Sprintf("place-%d", i), "gpu-a", "gpu-b"))
	}
	begin := time.Now()
	c.apply(strings.Join(yamls, "---\n"))
	var running, pending []obj
	if !waitFor(180*time.Second, func() bool {
		running, pending = nil, nil
		for i := 0; i <= len(c.Nodes); i++ {
			p := c.pod(fmt.Sprintf("place-%d", i))
			switch {
			case str(p, "status", "phase") == "Running" && field(p, "status", "containerStatuses", 0, "ready") == true:
				running = append(running, p)
			case str(p, "spec", "nodeName") == "" && podCondition(p, "PodScheduled", "reason") == "Unschedulable":
				pending = append(pending, p)
			}
		}
		return len(running) == len(c.Nodes) && len(pending) == 1
	}) {
		out, _ := c.kubectlErr("get", "pods,resourceclaims", "-n", "default", "-o", "wide")
		t.Fatalf("%d pods running and %d pending unschedulable within 180 s, want %d and 1:\n%s", len(running), len(pending), len(c.Nodes), out)
	}
	t.Logf("%d pods of two claims each running, one per node, and %s pending (%s) %.1f s after apply",
		len(running), str(pending[0], "metadata", "name"), podCondition(pending[0], "PodScheduled", "message"), time.Since(begin).Seconds())
	nodes, devices := map[string]string{}, map[string]string{}
	held := c.allHeld(t)
	c.noDeviceAllocatedTwice(t)
	for _, p := range running {
		name, node := str(p, "metadata", "name"), str(p, "spec", "nodeName")
		if other, ok := nodes[node]; ok {
			t.Errorf("pods %s and %s both on %s", other, name, node)
		}
		nodes[node] = name
		claims := c.podClaims(t, p)
		if len(claims) != 2 {
			t.Errorf("pod %s has claims %v, want gpu-a and gpu-b", name, keys(claims))
		}
		for _, cl := range claims {
			for _, d := range claimOnNode(t, cl, node) {
				if other, ok := devices[d]; ok {
					t.Errorf("device %s allocated to %s and %s", d, other, str(cl, "metadata", "name"))
				}
				devices[d] = str(cl, "metadata", "name")
			}
			if _, ok := held[node][str(cl, "metadata", "uid")]; !ok {
				t.Errorf("claim %s of %s is not held by nri-accel on %s (holds %v)", str(cl, "metadata", "name"), name, node, held[node])
			}
		}
		if n := c.fleetNode(node); n != nil && len(n.specFiles()) != 2 {
			t.Errorf("node %s has CDI specs %v, want the two of %s", node, n.specFiles(), name)
		}
		if len(held[node]) != 2 {
			t.Errorf("nri-accel on %s holds %v, want the two claims of %s", node, held[node], name)
		}
	}
	t.Logf("placement: %v", nodes)
	for i := 0; i <= len(c.Nodes); i++ {
		c.kubectl("delete", "pod", fmt.Sprintf("place-%d", i), "-n", "default", "--wait=false")
	}
	c.waitNoSpecs(t, 90*time.Second)
}

// podCondition answers a field of the pod's condition of type typ.
func podCondition(p obj, typ, key string) string {
	for _, cond := range list(p, "status", "conditions") {
		if str(cond, "type") == typ {
			return str(cond, key)
		}
	}
	return ""
}

// Scenario o, drain: a Deployment of two pods, one device each; `kubectl drain` of a node
// holding one of them. Its pods come back on the other nodes (which have free devices), their
// new claims allocated there; the old claims are deleted (their devices deallocated), the drained
// node's nri-accel holds nothing and no CDI spec is left on it, and nri-accel's own pod stays.
func scenarioFleetDrain(t *testing.T, f *fleet) {
	c := f.c
	c.apply(deploymentYAML("drain", 2, false))
	pods := c.waitAppRunning(t, "drain", 2, 120*time.Second)
	node := str(pods[0], "spec", "nodeName")
	var oldClaims []string
	for _, p := range pods {
		if str(p, "spec", "nodeName") == node {
			for _, cl := range c.podClaims(t, p) {
				oldClaims = append(oldClaims, str(cl, "metadata", "name"))
			}
		}
	}
	drained := c.fleetNode(node)
	if len(drained.specFiles()) != len(oldClaims) {
		t.Errorf("before the drain %s has specs %v for claims %v", node, drained.specFiles(), oldClaims)
	}
	begin := time.Now()
	c.kubectl("drain", node, "--ignore-daemonsets", "--timeout=120s")
	defer c.kubectl("uncordon", node)
	t.Logf("kubectl drain %s (claims %v): %.1f s", node, oldClaims, time.Since(begin).Seconds())
	moved := c.waitAppRunning(t, "drain", 2, 120*time.Second, node)
	t.Logf("both pods running off %s %.1f s after the drain began: %s, %s", node, time.Since(begin).Seconds(),
		str(moved[0], "spec", "nodeName"), str(moved[1], "spec", "nodeName"))
	for _, p := range moved {
		for _, cl := range c.podClaims(t, p) {
			claimOnNode(t, cl, str(p, "spec", "nodeName"))
		}
	}
	if !waitFor(90*time.Second, func() bool {
		for _, name := range oldClaims {
			if _, err := c.kubectlErr("get", "resourceclaim", name, "-n", "default"); err == nil {
				return false
			}
		}
		return len(drained.specFiles()) == 0 && len(drained.heldClaims(t)) == 0
	}) {
		t.Errorf("90 s after the drain: old claims %v, specs on %s %v, held there %v", oldClaims, node, drained.specFiles(), drained.heldClaims(t))
	}
	var ds []string
	for _, p := range c.accelPods(t) {
		if str(p, "spec", "nodeName") == node {
			ds = append(ds, str(p, "metadata", "name"))
		}
	}
	if len(ds) != 1 {
		t.Errorf("nri-accel's pods on the drained node: %v, want its one pod left (kubectl drain --ignore-daemonsets)", ds)
	}
	c.allHeld(t)
	c.noDeviceAllocatedTwice(t)
	c.kubectl("delete", "deployment", "drain", "-n", "default")
	c.waitNoSpecs(t, 90*time.Second)
}

// accelContainerPID answers the pid of the nri-accel container on node n (from runc's state).
func (c *Cluster) accelContainerPID(t *testing.T) int {
	t.Helper()
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
	t.Fatalf("no running nri-accel container on %s", c.node())
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
	t.Logf("the new pods became ready on %v; at most %d node(s) without a ready nri-accel at once", order, most)
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

// Scenario o, the webhook against the fleet: the chart's webhook (its RBAC and
// ValidatingWebhookConfiguration from `helm template`, roles.webhook with capacity slices) served
// by `nri-accel webhook` on the machine as scenario webhook_admission runs it (the apiserver cannot
// reach a Service's pods here: no kube-proxy), with the chart's config. With one device of each
// node's two held, a pod asking three devices (more than any node has) is refused, and one
// asking two (what a node has, though no node has them free now) is admitted.
func scenarioFleetWebhook(t *testing.T, f *fleet) {
	c := f.c
	const release, ns = "nri-accel", "nri-accel"
	c.apply(deploymentYAML("busy", len(c.Nodes), true))
	c.waitAppRunning(t, "busy", len(c.Nodes), 120*time.Second)
	defer func() {
		c.kubectl("delete", "deployment", "busy", "-n", "default")
		c.waitNoSpecs(t, 90*time.Second)
	}()

	ca, err := os.ReadFile(c.pki.CA)
	must(t, err)
	caBundle := base64.StdEncoding.EncodeToString(ca)
	tmpl, err := c.helm(t, "template", "--namespace", ns, release, chartDir(), "-f", f.values,
		"--set", "roles.webhook.enabled=true", "--set", "roles.webhook.caBundle="+caBundle)
	must(t, err)
	var rbac []obj
	var vwc obj
	for _, o := range yamlObjects(t, tmpl) {
		switch objName(o) {
		case "ServiceAccount/nri-accel-webhook", "ClusterRole/nri-accel-webhook", "ClusterRoleBinding/nri-accel-webhook":
			rbac = append(rbac, o)
		case "ValidatingWebhookConfiguration/nri-accel":
			vwc = o
		}
	}
	if len(rbac) != 3 || vwc == nil {
		t.Fatalf("the chart rendered %d of the webhook's RBAC objects and webhook configuration %v", len(rbac), vwc != nil)
	}
	if out, err := c.kubectlIn(jsonList(t, rbac), "apply", "-f", "-"); err != nil {
		t.Fatalf("applying the chart's webhook RBAC: %v\n%s", err, out)
	}
	token := strings.TrimSpace(c.kubectl("create", "token", "nri-accel-webhook", "-n", ns, "--duration", "1h"))
	kubeconfig := c.pki.tokenKubeconfig(t, "nri-accel-webhook", c.Server, token)
	// The release's config, as the webhook's pod mounts it, reaching the apiserver as the
	// webhook's service account.
	cfg := str(c.getJSON(t, "get", "configmap", release, "-n", ns), "data", "config.yaml")
	re := regexp.MustCompile(`(?m)^  kubeconfig: .*$`)
	if !re.MatchString(cfg) {
		t.Fatalf("no kubeconfig line in the release's config:\n%s", cfg)
	}
	dir := filepath.Join(c.Dir, "fleet-webhook")
	must(t, os.MkdirAll(filepath.Join(dir, "tls"), 0o755))
	whCfg := filepath.Join(dir, "config.yaml")
	must(t, os.WriteFile(whCfg, []byte(re.ReplaceAllString(cfg, "  kubeconfig: "+kubeconfig)), 0o644))
	crt, key := c.pki.issue(t, "fleet-webhook", "nri-accel-webhook", nil, "127.0.0.1")
	for from, to := range map[string]string{crt: "tls.crt", key: "tls.key"} {
		b, err := os.ReadFile(from)
		must(t, err)
		must(t, os.WriteFile(filepath.Join(dir, "tls", to), b, 0o600))
	}
	wh := startProc(t, "nri-accel-webhook", filepath.Join(c.Dir, "nri-accel-fleet-webhook.log"), []string{"NRI_ACCEL_LOG=info"},
		accelBin(t), "--config", whCfg, "webhook", "--listen", "127.0.0.1:0", "--tls-dir", filepath.Join(dir, "tls"))
	defer wh.Stop(5 * time.Second)
	served := regexp.MustCompile(`nri-accel webhook: serving (https://127\.0\.0\.1:\d+/validate)`)
	var url string
	if !waitFor(30*time.Second, func() bool {
		b, _ := os.ReadFile(wh.Log)
		if m := served.FindSubmatch(b); m != nil {
			url = string(m[1])
		}
		return url != "" || !wh.Running()
	}) || url == "" {
		t.Fatalf("nri-accel webhook is not serving:\n%s", tail(wh.Log, 30))
	}
	hook := field(vwc, "webhooks", 0).(map[string]any)
	hook["clientConfig"] = obj{"url": url, "caBundle": caBundle}
	hook["failurePolicy"] = "Fail"
	b, err := json.Marshal(vwc)
	must(t, err)
	if out, err := c.kubectlIn(string(b), "apply", "-f", "-"); err != nil {
		t.Fatalf("applying the webhook configuration: %v\n%s", err, out)
	}
	defer c.kubectlErr("delete", "validatingwebhookconfiguration", release, "--ignore-not-found")

	tooMany := fmt.Sprintf("family=exclusive,count=%d", fleetWholeDevices+1)
	create := func(name, ask string) error {
		_, err := c.kubectlIn(webhookPodYAML(name, ask), "create", "--dry-run=server", "-f", "-")
		return err
	}
	// The apiserver picks up the configuration, and the webhook its first list of slices, a
	// moment later.
	waitFor(60*time.Second, func() bool {
		err := create("fleet-probe", tooMany)
		return err != nil && strings.Contains(err.Error(), "denied the request")
	})
	want := fmt.Sprintf("it asks %d units of pool whole but the pool's devices have at most %d", fleetWholeDevices+1, fleetWholeDevices)
	if err := create("fleet-too-many", tooMany); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("a pod asking %s (each of %d nodes has %d devices) was not refused with %q: %v\nwebhook:\n%s",
			tooMany, len(c.Nodes), fleetWholeDevices, want, err, tail(wh.Log, 20))
	} else {
		t.Logf("refused: %v", err)
	}
	fits := fmt.Sprintf("family=exclusive,count=%d", fleetWholeDevices)
	if err := create("fleet-fits-one-node", fits); err != nil {
		t.Errorf("a pod asking %s (what one node has, though every node holds one device now) was refused: %v", fits, err)
	} else {
		t.Logf("admitted: %s, with one device held on each of %d nodes", fits, len(c.Nodes))
	}
}

// requestsByNode counts the apiserver's requests since `since` from its audit log, by node and
// by who made them (the node's kubelet: user system:node:<node>; its nri-accel: a service
// account token bound to a pod on the node, whose node the audit event names in
// user.extra["authentication.kubernetes.io/node-name"]) and verb. The rest of the cluster
// (controllers, scheduler, the test's kubectl) is left out.
func (c *Cluster) requestsByNode(t *testing.T, since time.Time) string {
	t.Helper()
	b, err := os.ReadFile(c.auditLog())
	if err != nil {
		return fmt.Sprintf("no audit log: %v", err)
	}
	counts := map[string]map[string]int{}
	for _, line := range strings.Split(string(b), "\n") {
		var ev struct {
			Verb string `json:"verb"`
			User struct {
				Username string              `json:"username"`
				Extra    map[string][]string `json:"extra"`
			} `json:"user"`
			UserAgent string    `json:"userAgent"`
			Stamp     time.Time `json:"requestReceivedTimestamp"`
		}
		if json.Unmarshal([]byte(line), &ev) != nil || ev.Stamp.Before(since) {
			continue
		}
		var node, who string
		if n, ok := strings.CutPrefix(ev.User.Username, "system:node:"); ok {
			node, who = n, "kubelet"
		} else if n := ev.User.Extra["authentication.kubernetes.io/node-name"]; len(n) == 1 &&
			strings.HasPrefix(ev.User.Username, "system:serviceaccount:nri-accel:") {
			node, who = n[0], "nri-accel"
		} else {
			continue
		}
		k := node + " " + who
		if counts[k] == nil {
			counts[k] = map[string]int{}
		}
		counts[k][ev.Verb]++
	}
	var out []string
	for k, verbs := range counts {
		var vs []string
		total := 0
		for v, n := range verbs {
			vs = append(vs, fmt.Sprintf("%s %d", v, n))
			total += n
		}
		sort.Strings(vs)
		out = append(out, fmt.Sprintf("  %s: %d (%s)", k, total, strings.Join(vs, ", ")))
	}
	sort.Strings(out)
	return strings.Join(out, "\n")
}
