package cluster

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// Scenario l (issue 38 item 4), on a cluster of its own with two whole devices, pool whole set to
// `unhealthy: taint-no-execute` and health_check_secs 1:
//
//   - other_door: a pod holding a whole device through the annotation path (no DRA) takes it out of
//     the ResourceSlice, so a DRA pod whose claim wants that device is Unschedulable (never bound,
//     never a refused NodePrepareResources and ContainerCreating), and runs on it once the
//     annotation pod is deleted (the device published again).
//   - taint: accel1's device node removed (the health test hook, docs/kubernetes.md): whole-accel1
//     stays in the slice with the taint accel.nri.io/unhealthy=device-node-gone:NoExecute; the
//     kube-controller-manager's device taint eviction controller deletes the DRA pod holding it;
//     a new DRA pod wanting it is Unschedulable. The node made again: the taint goes and the
//     waiting pod runs on accel1.
//
// On 1.34 the DRADeviceTaints gate is alpha; the suite turns it on in the apiserver, scheduler
// and controller-manager (cluster_test.go's gate list) and serves resource.k8s.io/v1alpha3.
func TestClusterTaints(t *testing.T) {
	requireRoot(t)
	for _, v := range kubeVersions() {
		t.Run(v, func(t *testing.T) {
			begin := time.Now()
			c := Start(t, v, Options{WholeDevices: 2, HealthCheckSecs: 1, NoExclusiveCPUs: true,
				Unhealthy: "taint-no-execute"})
			t.Logf("cluster up in %.1f s", time.Since(begin).Seconds())
			c.applyTemplate(t, "one-gpu", "accel-gpu")
			t.Run("other_door", func(t *testing.T) { taintsOtherDoor(t, c) })
			t.Run("taint", func(t *testing.T) { taintsUnhealthy(t, c) })
			t.Logf("scenario l took %.1f s (cluster start included)", time.Since(begin).Seconds())
		})
	}
}

// deviceTemplate creates a ResourceClaimTemplate `name` asking for the whole device `id`.
func (c *Cluster) deviceTemplate(name, id string) {
	c.apply(claimTemplateYAML(name, oneDevice("accel-gpu", fmt.Sprintf(`device.attributes["accel.nri.io"].deviceId == "%s"`, id), "")))
}

// heldByAnnotation answers the device ids nri-accel's claims of the annotation path hold.
func (c *Cluster) heldByAnnotation(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, cl := range c.accelClaims(t) {
		if str(cl, "origin", "kind") != "annotation" {
			continue
		}
		for _, r := range list(cl, "results") {
			out = append(out, str(r, "device_id"))
		}
	}
	return out
}

func taintsOtherDoor(t *testing.T, c *Cluster) {
	c.apply(nodeAnnotationPodYAML("l-annotated", "count=1,family=exclusive"))
	c.waitRunning(t, "l-annotated", 120*time.Second)
	held := c.heldByAnnotation(t)
	if len(held) != 1 {
		t.Fatalf("the annotation pod's claims hold %v, want one device", held)
	}
	name := "whole-" + held[0]
	since := time.Now()
	if !waitFor(30*time.Second, func() bool { return c.publishedDevices(t)[name] == nil }) {
		t.Fatalf("%s, held by the annotation pod, is still published: %v", name, sortedKeys(c.publishedDevices(t)))
	}
	t.Logf("%s withdrawn %.1f s after the annotation pod ran", name, time.Since(since).Seconds())
	st, err := c.AccelStatus()
	must(t, err)
	if w := fmt.Sprint(field(st, "kubernetes", "resource_slices", "withdrawn")); !strings.Contains(w, "held-elsewhere") {
		t.Errorf("nri-accel's status lists as withdrawn %s, want %s held elsewhere", w, held[0])
	}

	// A DRA pod wanting that very device: the scheduler finds none (not ContainerCreating with
	// prepares refused "device ... is held by claim ctr-...").
	c.deviceTemplate("l-held", held[0])
	c.apply(podYAML("l-dra", "l-held"))
	msg := c.waitUnschedulable(t, "l-dra", 60*time.Second)
	t.Logf("l-dra: Unschedulable: %s", msg)
	if p := c.pod("l-dra"); str(p, "spec", "nodeName") != "" {
		t.Fatalf("l-dra was bound to %s while the annotation pod holds its device", str(p, "spec", "nodeName"))
	}
	events := c.kubectl("get", "events", "-n", "default", "--field-selector", "involvedObject.name=l-dra")
	if strings.Contains(events, "is held by claim") || strings.Contains(events, "FailedPrepare") {
		t.Errorf("l-dra saw refused prepares:\n%s", events)
	}

	// The annotation pod deleted: the device is published again and the DRA pod runs on it.
	c.deletePod(t, "l-annotated")
	released := time.Now()
	p := c.waitRunning(t, "l-dra", 120*time.Second)
	t.Logf("l-dra Running %.1f s after the annotation pod was deleted", time.Since(released).Seconds())
	want := "accel.nri.io/" + nodeName + "/" + name
	if got := allocatedDevices(c.claimOfPod(t, p)); len(got) != 1 || got[0] != want {
		t.Errorf("l-dra's claim allocated %v, want [%s]", got, want)
	}
	// A device held by a DRA claim stays published: the scheduler knows that holder.
	if c.publishedDevices(t)[name] == nil {
		t.Errorf("%s, held by l-dra's DRA claim, is not published", name)
	}
	c.deletePod(t, "l-dra")
	if !waitFor(60*time.Second, func() bool { return len(c.accelClaims(t)) == 0 && len(c.specFiles()) == 0 }) {
		t.Fatalf("after the pods went nri-accel still holds %v, specs %v", c.accelClaims(t), c.specFiles())
	}
}

func taintsUnhealthy(t *testing.T, c *Cluster) {
	c.deviceTemplate("l-accel1", "accel1")
	c.apply(podYAML("l-holder", "l-accel1"))
	c.waitRunning(t, "l-holder", 120*time.Second)

	must(t, c.Devs.Remove(1))
	hooked := time.Now()
	var taint obj
	if !waitFor(60*time.Second, func() bool {
		d := c.publishedDevices(t)["whole-accel1"]
		if ts := list(d, "taints"); len(ts) == 1 {
			taint, _ = ts[0].(map[string]any)
		}
		return taint != nil
	}) {
		t.Fatalf("whole-accel1 not tainted 60 s after its node was removed: %v", c.publishedDevices(t)["whole-accel1"])
	}
	t.Logf("whole-accel1 tainted %.1f s after the hook: %v", time.Since(hooked).Seconds(), taint)
	if str(taint, "key") != "accel.nri.io/unhealthy" || str(taint, "value") != "device-node-gone" ||
		str(taint, "effect") != "NoExecute" || str(taint, "timeAdded") == "" {
		t.Errorf("whole-accel1's taint %v, want accel.nri.io/unhealthy=device-node-gone:NoExecute with a time", taint)
	}
	if ts := list(c.publishedDevices(t)["whole-accel0"], "taints"); len(ts) != 0 {
		t.Errorf("the healthy whole-accel0 carries taints %v", ts)
	}

	// NoExecute: the device taint eviction controller deletes the pod using it.
	if !waitFor(90*time.Second, func() bool { return c.pod("l-holder") == nil }) {
		t.Fatalf("l-holder not evicted 90 s after whole-accel1 was tainted NoExecute:\n%s",
			c.kubectl("describe", "pod", "l-holder", "-n", "default"))
	}
	t.Logf("l-holder evicted %.1f s after the hook", time.Since(hooked).Seconds())

	// A new pod wanting the tainted device is kept off it by the scheduler.
	c.apply(podYAML("l-waits", "l-accel1"))
	msg := c.waitUnschedulable(t, "l-waits", 60*time.Second)
	t.Logf("l-waits: Unschedulable: %s", msg)

	must(t, c.Devs.Restore(1))
	restored := time.Now()
	if !waitFor(60*time.Second, func() bool {
		d := c.publishedDevices(t)["whole-accel1"]
		return d != nil && len(list(d, "taints")) == 0
	}) {
		t.Fatalf("whole-accel1's taint still there 60 s after its node came back: %v", c.publishedDevices(t)["whole-accel1"])
	}
	t.Logf("whole-accel1's taint gone %.1f s after the node came back", time.Since(restored).Seconds())
	p := c.waitRunning(t, "l-waits", 120*time.Second)
	t.Logf("l-waits Running %.1f s after the node came back", time.Since(restored).Seconds())
	want := "accel.nri.io/" + nodeName + "/whole-accel1"
	if got := allocatedDevices(c.claimOfPod(t, p)); len(got) != 1 || got[0] != want {
		t.Errorf("l-waits's claim allocated %v, want [%s]", got, want)
	}
	c.deletePod(t, "l-waits")
	if !waitFor(60*time.Second, func() bool { return len(c.accelClaims(t)) == 0 && len(c.specFiles()) == 0 }) {
		t.Errorf("after the pods went nri-accel still holds %v, specs %v", c.accelClaims(t), c.specFiles())
	}
}
