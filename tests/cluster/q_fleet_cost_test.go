package cluster

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestClusterFleetCost measures what one node's nri-accel costs the apiserver (issue 37 item 4):
// on a fleet with the chart installed on every node, the requests each node's nri-accel makes
// (from the apiserver's audit log, one count per request, by verb and resource) while idle,
// under claim churn (pods with one claim each created and deleted on every node, round after
// round) and through a rolling `helm upgrade`; and the bytes of each node's ResourceSlices. It
// asserts no figures: it prints them (docs/performance.md, "Cost per node"; tests/README.md).
// Skipped unless NRI_ACCEL_CLUSTER_COST=1; NRI_ACCEL_CLUSTER_NODES sets the nodes (default 3),
// NRI_ACCEL_CLUSTER_COST_SECS each window (default 120), NRI_ACCEL_CLUSTER_COST_IDLE_SECS the idle
// one (default the same).
func TestClusterFleetCost(t *testing.T) {
	if os.Getenv("NRI_ACCEL_CLUSTER_COST") != "1" {
		t.Skip("SKIPPED: the fleet cost measurement runs with NRI_ACCEL_CLUSTER_COST=1 (tests/README.md, \"A fleet\")")
	}
	requireRoot(t)
	nodes := fleetNodes(t, 3)
	window := 120 * time.Second
	if s := os.Getenv("NRI_ACCEL_CLUSTER_COST_SECS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 10 {
			t.Fatalf("NRI_ACCEL_CLUSTER_COST_SECS=%q: want seconds, 10 or more", s)
		}
		window = time.Duration(v) * time.Second
	}
	// The idle window should span the publisher's 10-minute resync and a watch's renewal.
	idle := window
	if s := os.Getenv("NRI_ACCEL_CLUSTER_COST_IDLE_SECS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 10 {
			t.Fatalf("NRI_ACCEL_CLUSTER_COST_IDLE_SECS=%q: want seconds, 10 or more", s)
		}
		idle = time.Duration(v) * time.Second
	}
	for _, v := range kubeVersions() {
		t.Run(v, func(t *testing.T) {
			c := Start(t, v, Options{Nodes: nodes, NoHostAccel: true})
			f := installFleet(t, c)
			var report []string
			add := func(s string) { report = append(report, s); t.Log(s) }

			// Slices: what each node publishes, in bytes of JSON as the apiserver serves them.
			for _, n := range c.Nodes {
				var total, count int
				for _, s := range list(c.getJSON(t, "get", "resourceslices", "--field-selector", "spec.nodeName="+n.NodeName), "items") {
					b, err := json.Marshal(s)
					must(t, err)
					total += len(b)
					count++
				}
				add(fmt.Sprintf("node %s: %d ResourceSlices, %d bytes", n.NodeName, count, total))
			}

			// Idle: after a settling minute, nothing happens for a window.
			time.Sleep(30 * time.Second)
			from := time.Now()
			time.Sleep(idle)
			add(fmt.Sprintf("idle, %.0f s:\n%s", idle.Seconds(), c.accelRequests(t, from, time.Now())))

			// Churn: every round, one pod with one claim per node, running, then deleted.
			from = time.Now()
			rounds, claims := 0, 0
			for time.Since(from) < window {
				var names []string
				for i := range c.Nodes {
					name := fmt.Sprintf("churn-%d-%d", rounds, i)
					c.apply(fleetPodYAML(name, "gpu-a"))
					names = append(names, name)
				}
				for _, name := range names {
					c.waitRunning(t, name, 120*time.Second)
				}
				for _, name := range names {
					c.kubectl("delete", "pod", name, "-n", "default", "--wait=true", "--timeout=120s")
				}
				rounds++
				claims += len(names)
			}
			c.waitNoSpecs(t, 120*time.Second)
			to := time.Now()
			add(fmt.Sprintf("churn, %.0f s, %d rounds, %d claims prepared and unprepared (%.1f per node):\n%s",
				to.Sub(from).Seconds(), rounds, claims, float64(claims)/float64(len(c.Nodes)), c.accelRequests(t, from, to)))

			// A rolling upgrade: every node's nri-accel replaced, one node at a time.
			old := map[string]string{}
			for node, p := range c.waitFleetDeployed(t, nil, f.image) {
				old[node] = str(p, "metadata", "uid")
			}
			from = time.Now()
			f.helm(t, "upgrade", "nri-accel", chartDir(), "--reuse-values", "--set-string", "podAnnotations.cost=upgrade", "--wait", "--timeout", "5m")
			c.waitFleetDeployed(t, old, f.image)
			to = time.Now()
			add(fmt.Sprintf("rolling upgrade, %.0f s:\n%s", to.Sub(from).Seconds(), c.accelRequests(t, from, to)))
			if out := os.Getenv("NRI_ACCEL_CLUSTER_COST_OUT"); out != "" {
				must(t, os.WriteFile(out, []byte(strings.Join(report, "\n")+"\n"), 0o644))
			}
		})
	}
}

// accelRequests counts the requests the nodes' nri-accel made between from and to, by node,
// then verb and resource.
func (c *Cluster) accelRequests(t *testing.T, from, to time.Time) string {
	t.Helper()
	counts := map[string]map[string]int{}
	for _, ev := range c.auditEvents(t, from, to) {
		node := ev.accelNode()
		if node == "" {
			continue
		}
		if counts[node] == nil {
			counts[node] = map[string]int{}
		}
		counts[node][ev.Verb+" "+ev.Resource]++
	}
	return countLines(counts)
}
