package cluster

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// Scenario o, a fleet (issue 37): nri-accel installed with the Helm chart, as an operator
// installs it, on every node of a several-node cluster (fleet_test.go), then what a fleet's
// scheduler and operators do to it. By default (tests/cluster.sh test, .ci/run) two nodes and
// the scenarios placement and drain; NRI_ACCEL_CLUSTER_FLEET=full runs every scenario on
// NRI_ACCEL_CLUSTER_NODES nodes (default 3): node_lost and helm_upgrade_rolls
// (o_fleet_faults_test.go) and webhook_judges_the_fleet (o_fleet_webhook_test.go).
// tests/README.md, "A fleet" and the scenario table, says what each proves.
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
				t.Logf("node %s at the end: %s", n.NodeName, n.nodeCost(t))
			}
			t.Logf("requests per node (the apiserver's audit log, since the chart's install):\n%s", c.requestsByNode(t, f.installed))
		})
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
