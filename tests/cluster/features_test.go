package cluster

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"
)

// TestClusterFeatures: the DRA features of issue 29 (h) that are the scheduler's over what
// nri-accel publishes, each allocated for real and prepared through nri-accel, on one cluster per
// version: shares of a shared device (consumable capacity, KEP-5075), partitions of a sliced
// device (KEP-4815, 1.35 and later: a 1.34 apiserver refuses the counter layout and nri-accel
// withdraws the partitions), and a prioritized list (KEP-4816) whose first choice cannot be met,
// with an opaque configuration naming the parent request.
func TestClusterFeatures(t *testing.T) {
	requireRoot(t)
	for _, v := range kubeVersions() {
		t.Run(v, func(t *testing.T) {
			c := Start(t, v, Options{})
			runScenarios(t, c, false,
				scenario{"shares_of_one_device", featureShares},
				scenario{"partitions_of_one_device", featurePartitions},
				scenario{"prioritized_list", featurePrioritizedList},
			)
		})
	}
}

// holders runs pods named prefix-1..n on template, expects `fit` of them (whichever the
// scheduler picks) to run and the rest to stay Pending and unscheduled for 15 s, and answers the
// running ones and the devices they got.
func (c *Cluster) holders(t *testing.T, prefix, template string, n, fit int) (running []string, got []string) {
	t.Helper()
	var names []string
	for i := 1; i <= n; i++ {
		names = append(names, fmt.Sprintf("%s-%d", prefix, i))
		c.apply(podYAML(names[i-1], template))
	}
	deadline := time.Now().Add(120 * time.Second)
	for len(running) < fit && time.Now().Before(deadline) {
		running = nil
		for _, name := range names {
			p := c.pod(name)
			if str(p, "status", "phase") == "Running" && field(p, "status", "containerStatuses", 0, "ready") == true {
				running = append(running, name)
			}
		}
		time.Sleep(time.Second)
	}
	if len(running) != fit {
		out, _ := c.kubectlErr("get", "pods", "-n", "default", "-o", "wide")
		t.Fatalf("%v of %s-* Running, want %d:\n%s\nnri-accel:\n%s", running, prefix, fit, out, tail(c.Accel.Log, 20))
	}
	// The rest stay Pending, never bound to the node, for 15 s.
	for end := time.Now().Add(15 * time.Second); time.Now().Before(end); time.Sleep(time.Second) {
		bound := 0
		for _, name := range names {
			if str(c.pod(name), "spec", "nodeName") != "" {
				bound++
			}
		}
		if bound != fit {
			t.Fatalf("%d of %s-* bound to the node, want %d (one more than the devices hold)", bound, prefix, fit)
		}
	}
	for _, name := range running {
		got = append(got, allocatedDevices(c.claimOfPod(t, c.pod(name)))...)
	}
	sort.Strings(got)
	if held := len(c.accelClaims(t)); held != fit {
		t.Errorf("nri-accel holds %d claims, want %d", held, fit)
	}
	return running, got
}

// release deletes pods prefix-1..n and waits until nri-accel holds nothing and no spec is left.
func (c *Cluster) release(t *testing.T, prefix string, n int) {
	t.Helper()
	for i := 1; i <= n; i++ {
		c.deletePod(t, fmt.Sprintf("%s-%d", prefix, i))
	}
	if !waitFor(60*time.Second, func() bool { return len(c.accelClaims(t)) == 0 && len(c.specFiles()) == 0 }) {
		t.Fatalf("after %s-* went, nri-accel still holds %v, specs %v", prefix, c.accelClaims(t), c.specFiles())
	}
}

// The shared pool's one device has two replicas: two pods get a share each of shared-shared0
// (with multiple allocations, DRAConsumableCapacity), the third stays Pending; inside each the
// device node is there.
func featureShares(t *testing.T, c *Cluster) {
	c.apply(claimTemplateYAML("one-share", oneDevice("accel-gpu-shared", "", "")))
	slices := list(c.getJSON(t, "get", "resourceslices", "--field-selector", "spec.driver=accel.nri.io"), "items")
	multiple := false
	for _, s := range slices {
		for _, d := range list(s, "spec", "devices") {
			if str(d, "name") == "shared-shared0" && field(d, "allowMultipleAllocations") == true {
				multiple = true
			}
		}
	}
	fit := 1
	if multiple {
		fit = 2
	}
	t.Logf("shared-shared0 allows multiple allocations: %v; %d pods fit", multiple, fit)
	running, got := c.holders(t, "fs", "one-share", fit+1, fit)
	for _, d := range got {
		if !strings.HasSuffix(d, "/shared-shared0") {
			t.Errorf("a share pod got %s, want shared-shared0 (%v)", d, got)
		}
	}
	for _, name := range running {
		if _, err := c.ExecIn("default", name, "app", "test", "-c", c.Devs.Path(1)); err != nil {
			t.Errorf("shared0's device node is not in %s: %v", name, err)
		}
	}
	c.release(t, "fs", fit+1)
}

// The sliced pool's device has two slots and a profile `half` of one slot: two pods get one
// partition each (different ones, consuming the device's counters), the third stays Pending.
func featurePartitions(t *testing.T, c *Cluster) {
	if c.minor() < 35 {
		t.Skip("SKIPPED: on 1.34 the apiserver refuses the partitions' counter layout and nri-accel withdraws them (docs/dra.md, \"Feature gates\")")
	}
	c.apply(claimTemplateYAML("one-half", oneDevice("accel-gpu-partition", `device.attributes["accel.nri.io"].profile == "half"`, "")))
	running, got := c.holders(t, "fp", "one-half", 3, 2)
	if len(got) != 2 || !strings.HasSuffix(got[0], "/sliced-sliced0-half-0") || !strings.HasSuffix(got[1], "/sliced-sliced0-half-1") {
		t.Errorf("the partition pods got %v, want sliced-sliced0-half-0 and -1", got)
	}
	for _, name := range running {
		if _, err := c.ExecIn("default", name, "app", "test", "-c", c.Devs.Path(2)); err != nil {
			t.Errorf("sliced0's device node is not in %s: %v", name, err)
		}
		env, err := c.ExecIn("default", name, "app", "env")
		must(t, err)
		if !strings.Contains(env, "ACCEL_SLICE_PROFILE=half\n") {
			t.Errorf("%s has no ACCEL_SLICE_PROFILE=half:\n%s", name, env)
		}
	}
	c.release(t, "fp", 3)
}

// A claim whose first choice (two exclusive devices; the node has one) cannot be met gets its
// second (one device): the result names the subrequest `gpu/one`, nri-accel prepares it, and the
// opaque configuration given for the parent request `gpu` reaches the container.
func featurePrioritizedList(t *testing.T, c *Cluster) {
	c.apply(`apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: two-or-one, namespace: default}
spec:
  spec:
    devices:
      requests:
        - name: gpu
          firstAvailable:
            - {name: two, deviceClassName: accel-gpu, allocationMode: ExactCount, count: 2}
            - {name: one, deviceClassName: accel-gpu, allocationMode: ExactCount, count: 1}
      config:
        - requests: [gpu]
          opaque:
            driver: accel.nri.io
            parameters:
              apiVersion: accel.nri.io/v1alpha1
              kind: DeviceConfig
              env: {NRI_ACCEL_PICKED: second-choice}
`)
	c.apply(podYAML("fl-1", "two-or-one"))
	p := c.waitRunning(t, "fl-1", 120*time.Second)
	claim := c.claimOfPod(t, p)
	results := list(claim, "status", "allocation", "devices", "results")
	if len(results) != 1 || str(results[0], "request") != "gpu/one" || str(results[0], "device") != "whole-accel0" {
		t.Errorf("the claim's results are %v, want one for request gpu/one on whole-accel0", results)
	}
	env, err := c.ExecIn("default", "fl-1", "app", "env")
	must(t, err)
	if !strings.Contains(env, "NRI_ACCEL_PICKED=second-choice\n") {
		t.Errorf("the parent request's configured env is not inside:\n%s\nspecs:\n%s", env, c.specDump())
	}
	c.release(t, "fl", 1)
}
