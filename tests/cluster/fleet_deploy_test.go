package cluster

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"
)

// The fleet's deployment and the helpers its scenarios share (o_fleet_test.go): the chart
// installed on every node, workloads of Deployments and pods holding devices, and what the
// nodes and the apiserver say about them.

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
		t.Logf("node %s after the install: %s", n.NodeName, n.nodeCost(t))
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

// appPods answers the pods of namespace default labelled app=<app> that are not being deleted.
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

// auditEvent is one request of the apiserver's audit log, as the fleet's counts read it.
type auditEvent struct {
	Verb     string
	Username string
	// Node is the node a pod-bound service account token names
	// (user.extra["authentication.kubernetes.io/node-name"]), if any.
	Node     string
	Resource string // plural, then /subresource when there is one
}

// auditEvents answers the requests the apiserver received between from and to (to zero: up to
// now), each once (a long request such as a watch is logged at its start and its end under one
// audit ID).
func (c *Cluster) auditEvents(t *testing.T, from, to time.Time) []auditEvent {
	t.Helper()
	b, err := os.ReadFile(c.auditLog())
	must(t, err)
	seen := map[string]bool{}
	var out []auditEvent
	for _, line := range strings.Split(string(b), "\n") {
		var ev struct {
			AuditID string `json:"auditID"`
			Verb    string `json:"verb"`
			User    struct {
				Username string              `json:"username"`
				Extra    map[string][]string `json:"extra"`
			} `json:"user"`
			ObjectRef struct {
				Resource    string `json:"resource"`
				Subresource string `json:"subresource"`
			} `json:"objectRef"`
			Stamp time.Time `json:"requestReceivedTimestamp"`
		}
		if json.Unmarshal([]byte(line), &ev) != nil || ev.Stamp.Before(from) || (!to.IsZero() && ev.Stamp.After(to)) || seen[ev.AuditID] {
			continue
		}
		seen[ev.AuditID] = true
		e := auditEvent{Verb: ev.Verb, Username: ev.User.Username, Resource: ev.ObjectRef.Resource}
		if ev.ObjectRef.Subresource != "" {
			e.Resource += "/" + ev.ObjectRef.Subresource
		}
		if n := ev.User.Extra["authentication.kubernetes.io/node-name"]; len(n) == 1 {
			e.Node = n[0]
		}
		out = append(out, e)
	}
	return out
}

// accelNode answers the node of a request nri-accel made (its chart's service account, with a
// token bound to a pod on the node), or "".
func (e auditEvent) accelNode() string {
	if strings.HasPrefix(e.Username, "system:serviceaccount:nri-accel:") {
		return e.Node
	}
	return ""
}

// countLines writes counts (who -> kind -> requests) one line per who, sorted.
func countLines(counts map[string]map[string]int) string {
	var out []string
	for who, kinds := range counts {
		var ks []string
		total := 0
		for k, n := range kinds {
			ks = append(ks, fmt.Sprintf("%s %d", k, n))
			total += n
		}
		sort.Strings(ks)
		out = append(out, fmt.Sprintf("  %s: %d (%s)", who, total, strings.Join(ks, ", ")))
	}
	sort.Strings(out)
	return strings.Join(out, "\n")
}

// requestsByNode counts the apiserver's requests since `since` from its audit log, by node and
// by who made them (the node's kubelet: user system:node:<node>; its nri-accel: auditEvent's
// accelNode) and verb. The rest of the cluster (controllers, scheduler, the test's kubectl) is
// left out.
func (c *Cluster) requestsByNode(t *testing.T, since time.Time) string {
	t.Helper()
	counts := map[string]map[string]int{}
	for _, ev := range c.auditEvents(t, since, time.Time{}) {
		var k string
		if n, ok := strings.CutPrefix(ev.Username, "system:node:"); ok {
			k = n + " kubelet"
		} else if n := ev.accelNode(); n != "" {
			k = n + " nri-accel"
		} else {
			continue
		}
		if counts[k] == nil {
			counts[k] = map[string]int{}
		}
		counts[k][ev.Verb]++
	}
	return countLines(counts)
}
