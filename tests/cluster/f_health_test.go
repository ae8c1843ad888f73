package cluster

import (
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"
)

// The health check period of scenario f's clusters: short, so that a change shows within seconds.
const fHealthCheckSecs = 1

// Scenario f, device health: a device made unhealthy through the documented test hook (its device
// node removed; docs/kubernetes.md, "Exercising device health") and made healthy again. Through
// DRA (its own cluster, `dra`): the device is withdrawn from the ResourceSlice (the pool keeps
// the default `unhealthy: withdraw`, docs/dra.md, "Device health"; scenario l taints), a pod wanting it stays
// Pending with the scheduler's reason while a pod wanting any device runs on the healthy one,
// and the running pod that holds it shows it Unhealthy in its status where the kubelet reports
// device health (ResourceHealthStatus). Through the device plugin (its own cluster,
// `device_plugin`, no DRA): ListAndWatch lists it Unhealthy, the Node's allocatable drops, a pod
// beyond what is healthy stays Pending, and the holder's status shows it. Restored: healthy
// again, the slice and allocatable are back and the waiting pod runs on it.
func TestClusterHealth(t *testing.T) {
	requireRoot(t)
	for _, v := range kubeVersions() {
		t.Run(v, func(t *testing.T) {
			t.Run("dra", func(t *testing.T) {
				begin := time.Now()
				c := Start(t, v, Options{WholeDevices: 2, HealthCheckSecs: fHealthCheckSecs, NoExclusiveCPUs: true})
				healthDRA(t, c)
				t.Logf("dra took %.1f s", time.Since(begin).Seconds())
			})
			t.Run("device_plugin", func(t *testing.T) {
				begin := time.Now()
				c := Start(t, v, Options{WholeDevices: 2, HealthCheckSecs: fHealthCheckSecs, NoExclusiveCPUs: true,
					DevicePlugin: true, NoDRA: true})
				healthDevicePlugin(t, c)
				t.Logf("device_plugin took %.1f s", time.Since(begin).Seconds())
			})
		})
	}
}

// healthInPodStatus reports whether the kubelet of c puts device health in the pod's status
// (feature gate ResourceHealthStatus: alpha in 1.34, turned on by the suite; beta from 1.36),
// and whether it adds the driver's message (ResourceHealthStatusMessage, from 1.37).
func (c *Cluster) healthInPodStatus() (status, message bool) {
	return c.Gates["ResourceHealthStatus"] != "", c.Gates["ResourceHealthStatusMessage"] != ""
}

// resourceHealth answers the health the pod's first container status reports for resource
// `name` (a claim `claim:<name>` or an extended resource): the first entry's id, health and
// message, or all empty when the status has none.
func resourceHealth(p obj, name string) (id, health, message string) {
	for _, rs := range list(p, "status", "containerStatuses", 0, "allocatedResourcesStatus") {
		if str(rs, "name") == name {
			r := field(rs, "resources", 0)
			return str(r, "resourceID"), str(r, "health"), str(r, "message")
		}
	}
	return "", "", ""
}

// waitResourceHealth waits until pod's status reports `want` for resource `name`, and answers
// the entry's id and message.
func (c *Cluster) waitResourceHealth(t *testing.T, pod, name, want string, within time.Duration) (string, string) {
	t.Helper()
	var id, health, msg string
	if !waitFor(within, func() bool {
		id, health, msg = resourceHealth(c.pod(pod), name)
		return health == want
	}) {
		t.Fatalf("pod %s's status reports %q for %s within %s, want %s: %v", pod, health, name, within, want,
			field(c.pod(pod), "status", "containerStatuses", 0, "allocatedResourcesStatus"))
	}
	return id, msg
}

// waitUnschedulable waits for the scheduler's Unschedulable verdict on pod and answers its message.
func (c *Cluster) waitUnschedulable(t *testing.T, pod string, within time.Duration) string {
	t.Helper()
	var msg string
	if !waitFor(within, func() bool {
		for _, cond := range list(c.pod(pod), "status", "conditions") {
			if str(cond, "type") == "PodScheduled" && str(cond, "reason") == "Unschedulable" {
				msg = str(cond, "message")
				return true
			}
		}
		return false
	}) {
		t.Fatalf("pod %s not Unschedulable within %s:\n%s", pod, within, c.kubectl("describe", "pod", pod, "-n", "default"))
	}
	return msg
}

// publishedDevices answers the devices of nri-accel's slices on the server, by name.
func (c *Cluster) publishedDevices(t *testing.T) map[string]obj {
	t.Helper()
	out := map[string]obj{}
	for _, s := range list(c.getJSON(t, "get", "resourceslices", "--field-selector", "spec.driver=accel.nri.io"), "items") {
		for _, d := range list(s, "spec", "devices") {
			out[str(d, "name")] = d.(map[string]any)
		}
	}
	return out
}

func sortedKeys(m map[string]obj) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// unhealthyDevices answers what nri-accel's status says is unhealthy: device id -> reason.
func (c *Cluster) unhealthyDevices(t *testing.T) map[string]string {
	t.Helper()
	st, err := c.AccelStatus()
	if err != nil {
		t.Fatalf("nri-accel status: %v", err)
	}
	out := map[string]string{}
	m, _ := field(st, "device_health", "unhealthy").(map[string]any)
	for id, r := range m {
		out[id], _ = r.(string)
	}
	return out
}

// deviceInside answers the fake devices a pod's container sees (ls of their dir).
func (c *Cluster) deviceInside(t *testing.T, pod string) string {
	t.Helper()
	out, err := c.ExecIn("default", pod, "app", "ls", c.Devs.Dir)
	if err != nil {
		t.Fatalf("listing the devices inside %s: %v", pod, err)
	}
	return strings.TrimSpace(out)
}

// healthDRA: the device accel1 (whole-accel1) through DRA.
func healthDRA(t *testing.T, c *Cluster) {
	inStatus, withMessage := c.healthInPodStatus()
	t.Logf("gates: %v; device health in pod status: %v, with the driver's message: %v", c.Gates, inStatus, withMessage)
	devs := c.publishedDevices(t)
	if devs["whole-accel0"] == nil || devs["whole-accel1"] == nil {
		t.Fatalf("published devices %v, want whole-accel0 and whole-accel1", sortedKeys(devs))
	}
	c.applyTemplate(t, "one-gpu", "accel-gpu")
	accel1 := oneDevice("accel-gpu", `device.attributes["accel.nri.io"].deviceId == "accel1"`, "")
	c.apply(claimTemplateYAML("f-accel1", accel1))
	// The holder's claim is a ResourceClaim of its own whose name is the pod's name for it: the
	// 1.34 kubelet matches the container's claim reference against the ResourceClaim's name when
	// it fills allocatedResourcesStatus, so a claim made from a template (another name) never
	// shows there (fixed by 1.37, which resolves the name through the pod's status).
	c.apply(claimYAML("f-accel1", accel1))
	c.apply(strings.Replace(strings.Replace(podYAML("f-holder", "one-gpu"),
		"{name: gpu, resourceClaimTemplateName: one-gpu}", "{name: f-accel1, resourceClaimName: f-accel1}", 1),
		"claims: [{name: gpu}]", "claims: [{name: f-accel1}]", 1))
	p := c.waitRunning(t, "f-holder", 120*time.Second)
	want := "accel.nri.io/" + nodeName + "/whole-accel1"
	if got := allocatedDevices(c.getJSON(t, "get", "resourceclaim", "f-accel1", "-n", "default")); len(got) != 1 || got[0] != want {
		t.Fatalf("f-holder's claim allocated %v, want [%s]", got, want)
	}
	if inStatus {
		id, _ := c.waitResourceHealth(t, "f-holder", "claim:f-accel1", "Healthy", 60*time.Second)
		t.Logf("f-holder's status before: claim:f-accel1 %s Healthy", id)
	}

	// The hook: accel1's device node removed.
	must(t, c.Devs.Remove(1))
	hooked := time.Now()
	var reason string
	if !waitFor(30*time.Second, func() bool { reason = c.unhealthyDevices(t)["accel1"]; return reason != "" }) {
		t.Fatalf("nri-accel does not report accel1 unhealthy 30 s after its node was removed: %v", c.unhealthyDevices(t))
	}
	t.Logf("nri-accel: accel1 unhealthy after %.1f s: %s", time.Since(hooked).Seconds(), reason)
	if !strings.Contains(reason, c.Devs.Path(1)) || !strings.Contains(reason, "gone") {
		t.Errorf("the reason %q does not name the device node %s as gone", reason, c.Devs.Path(1))
	}
	if !waitFor(60*time.Second, func() bool { return c.publishedDevices(t)["whole-accel1"] == nil }) {
		t.Fatalf("whole-accel1 still in the slice 60 s after accel1 turned unhealthy: %v", sortedKeys(c.publishedDevices(t)))
	}
	t.Logf("whole-accel1 withdrawn from the slice %.1f s after the hook", time.Since(hooked).Seconds())
	// Withdrawn, not tainted (the default `unhealthy: withdraw`, docs/dra.md, "Device health"):
	// on 1.34 with the DRADeviceTaints alpha gate on and on 1.37 where taints are GA alike.
	devs = c.publishedDevices(t)
	if devs["whole-accel0"] == nil {
		t.Errorf("whole-accel0 (healthy) is gone from the slice too: %v", sortedKeys(devs))
	}
	for name, d := range devs {
		if taints := list(d, "taints"); len(taints) != 0 {
			t.Errorf("device %s carries taints %v; a pool with the default unhealthy: withdraw is not tainted", name, taints)
		}
	}
	st, err := c.AccelStatus()
	must(t, err)
	withdrawn := fmt.Sprint(field(st, "kubernetes", "resource_slices", "withdrawn"))
	if !strings.Contains(withdrawn, "accel1") || !strings.Contains(withdrawn, "unhealthy") {
		t.Errorf("nri-accel's status lists as withdrawn %s, want accel1 as unhealthy", withdrawn)
	}
	if inStatus {
		id, msg := c.waitResourceHealth(t, "f-holder", "claim:f-accel1", "Unhealthy", 90*time.Second)
		t.Logf("f-holder's status %.1f s after the hook: claim:f-accel1 %s Unhealthy, message %q", time.Since(hooked).Seconds(), id, msg)
		if withMessage && !strings.Contains(msg, "gone") {
			t.Errorf("f-holder's health message %q does not carry nri-accel's reason %q", msg, reason)
		}
	}
	// The holder keeps running with its device (only the host's node is gone).
	if ph := str(c.pod("f-holder"), "status", "phase"); ph != "Running" {
		t.Errorf("f-holder is %s after its device turned unhealthy", ph)
	}
	if got := c.deviceInside(t, "f-holder"); got != "accel1" {
		t.Errorf("f-holder sees devices %q, want accel1", got)
	}

	// The scheduler no longer places a claim on it; a claim for any device lands on accel0.
	c.deletePod(t, "f-holder")
	c.kubectl("delete", "resourceclaim", "f-accel1", "-n", "default")
	if !waitFor(60*time.Second, func() bool {
		out, _ := c.kubectlErr("get", "resourceclaims", "-n", "default", "-o", "name")
		return len(c.accelClaims(t)) == 0 && strings.TrimSpace(out) == ""
	}) {
		t.Fatalf("f-holder's claim is still there: nri-accel %v", c.accelClaims(t))
	}
	c.apply(podYAML("f-want-accel1", "f-accel1"))
	msg := c.waitUnschedulable(t, "f-want-accel1", 60*time.Second)
	t.Logf("f-want-accel1: Unschedulable: %s", msg)
	if !strings.Contains(msg, "claim") {
		t.Errorf("f-want-accel1's scheduling message %q does not name the claims", msg)
	}
	c.apply(podYAML("f-any", "one-gpu"))
	p = c.waitRunning(t, "f-any", 120*time.Second)
	want0 := "accel.nri.io/" + nodeName + "/whole-accel0"
	if got := allocatedDevices(c.claimOfPod(t, p)); len(got) != 1 || got[0] != want0 {
		t.Errorf("f-any's claim allocated %v, want [%s]", got, want0)
	}
	if p := c.pod("f-want-accel1"); str(p, "spec", "nodeName") != "" || str(p, "status", "phase") != "Pending" {
		t.Errorf("f-want-accel1 is %s on %q while accel1 is unhealthy, want Pending unbound", str(p, "status", "phase"), str(p, "spec", "nodeName"))
	}

	// Restored: healthy again, published again, and the waiting pod runs on it.
	must(t, c.Devs.Restore(1))
	restored := time.Now()
	if !waitFor(30*time.Second, func() bool { return len(c.unhealthyDevices(t)) == 0 }) {
		t.Fatalf("nri-accel still reports %v 30 s after accel1's node came back", c.unhealthyDevices(t))
	}
	if !waitFor(60*time.Second, func() bool { return c.publishedDevices(t)["whole-accel1"] != nil }) {
		t.Fatalf("whole-accel1 not published again 60 s after accel1 turned healthy: %v", sortedKeys(c.publishedDevices(t)))
	}
	t.Logf("whole-accel1 published again %.1f s after the node came back", time.Since(restored).Seconds())
	p = c.waitRunning(t, "f-want-accel1", 120*time.Second)
	t.Logf("f-want-accel1 Running %.1f s after the node came back", time.Since(restored).Seconds())
	if got := allocatedDevices(c.claimOfPod(t, p)); len(got) != 1 || got[0] != want {
		t.Errorf("f-want-accel1's claim allocated %v, want [%s]", got, want)
	}
	if got := c.deviceInside(t, "f-want-accel1"); got != "accel1" {
		t.Errorf("f-want-accel1 sees devices %q, want accel1", got)
	}
	if inStatus && c.minor() >= 37 {
		c.waitResourceHealth(t, "f-want-accel1", "claim:gpu", "Healthy", 60*time.Second)
	}
	c.deletePod(t, "f-any")
	c.deletePod(t, "f-want-accel1")
	if !waitFor(60*time.Second, func() bool { return len(c.accelClaims(t)) == 0 && len(c.specFiles()) == 0 }) {
		t.Errorf("after the pods went nri-accel still holds %v, specs %v", c.accelClaims(t), c.specFiles())
	}
}

// healthDevicePlugin: the device the first pod holds through the device plugin.
func healthDevicePlugin(t *testing.T, c *Cluster) {
	inStatus, _ := c.healthInPodStatus()
	const res = "accel.nri.io/whole"
	if !waitFor(60*time.Second, func() bool { return c.allocatable(res) == 2 }) {
		t.Fatalf("node allocatable %s = %d, want 2", res, c.allocatable(res))
	}
	c.apply(dpPodYAML("f-dp-holder", res, 1))
	c.waitRunning(t, "f-dp-holder", 120*time.Second)
	held := c.deviceInside(t, "f-dp-holder")
	var k int
	if _, err := fmt.Sscanf(held, "accel%d", &k); err != nil || k > 1 {
		t.Fatalf("f-dp-holder sees devices %q, want one of accel0 and accel1", held)
	}
	other := fmt.Sprintf("accel%d", 1-k)
	if inStatus {
		id, _ := c.waitResourceHealth(t, "f-dp-holder", res, "Healthy", 60*time.Second)
		if id != held {
			t.Errorf("f-dp-holder's status names device %q for %s, the container has %s", id, res, held)
		}
	}

	// The hook: the held device's node removed.
	must(t, c.Devs.Remove(k))
	hooked := time.Now()
	var reason string
	if !waitFor(30*time.Second, func() bool { reason = c.unhealthyDevices(t)[held]; return reason != "" }) {
		t.Fatalf("nri-accel does not report %s unhealthy 30 s after its node was removed: %v", held, c.unhealthyDevices(t))
	}
	t.Logf("nri-accel: %s unhealthy after %.1f s: %s", held, time.Since(hooked).Seconds(), reason)
	st, err := c.AccelStatus()
	must(t, err)
	var listed string
	for _, r := range list(st, "device_plugins", "resources") {
		if str(r, "name") == res {
			listed = fmt.Sprint(field(r, "unhealthy"))
		}
	}
	if !strings.Contains(listed, held) {
		t.Errorf("nri-accel's device plugin %s lists as unhealthy %s, want %s", res, listed, held)
	}
	if !waitFor(60*time.Second, func() bool { return c.allocatable(res) == 1 }) {
		t.Fatalf("node allocatable %s = %d 60 s after %s turned unhealthy, want 1", res, c.allocatable(res), held)
	}
	t.Logf("node allocatable %s 2 -> 1 %.1f s after the hook", res, time.Since(hooked).Seconds())
	capacity := c.kubectl("get", "node", nodeName, "-o", "jsonpath={.status.capacity."+strings.ReplaceAll(res, ".", "\\.")+"}")
	if capacity != "2" {
		t.Errorf("node capacity %s = %q, want 2 (an unhealthy device is counted in capacity, not in allocatable)", res, capacity)
	}
	if inStatus {
		id, _ := c.waitResourceHealth(t, "f-dp-holder", res, "Unhealthy", 90*time.Second)
		t.Logf("f-dp-holder's status %.1f s after the hook: %s %s Unhealthy", time.Since(hooked).Seconds(), res, id)
	}
	if got := c.deviceInside(t, "f-dp-holder"); got != held {
		t.Errorf("f-dp-holder sees devices %q after the hook, want %s", got, held)
	}

	// One device unhealthy (and held), one healthy and free: the scheduler counts only the
	// healthy one, and the holder's request already takes it, so a second pod does not fit.
	c.apply(dpPodYAML("f-dp-next", res, 1))
	msg := c.waitUnschedulable(t, "f-dp-next", 60*time.Second)
	t.Logf("f-dp-next: Unschedulable: %s", msg)
	if !strings.Contains(msg, "Insufficient "+res) {
		t.Errorf("f-dp-next's scheduling message %q, want Insufficient %s", msg, res)
	}
	// The holder gone, the healthy device places the waiting pod; the unhealthy one is not offered.
	c.deletePod(t, "f-dp-holder")
	c.waitRunning(t, "f-dp-next", 120*time.Second)
	if got := c.deviceInside(t, "f-dp-next"); got != other {
		t.Errorf("f-dp-next sees devices %q, want the healthy %s", got, other)
	}

	// Restored: healthy again, allocatable back, and a new pod gets it.
	must(t, c.Devs.Restore(k))
	restored := time.Now()
	if !waitFor(30*time.Second, func() bool { return len(c.unhealthyDevices(t)) == 0 }) {
		t.Fatalf("nri-accel still reports %v 30 s after %s's node came back", c.unhealthyDevices(t), held)
	}
	if !waitFor(60*time.Second, func() bool { return c.allocatable(res) == 2 }) {
		t.Fatalf("node allocatable %s = %d 60 s after %s turned healthy, want 2", res, c.allocatable(res), held)
	}
	t.Logf("node allocatable %s back to 2 %.1f s after the node came back", res, time.Since(restored).Seconds())
	c.apply(dpPodYAML("f-dp-after", res, 1))
	c.waitRunning(t, "f-dp-after", 120*time.Second)
	if got := c.deviceInside(t, "f-dp-after"); got != held {
		t.Errorf("f-dp-after sees devices %q, want the restored %s", got, held)
	}
	if inStatus {
		c.waitResourceHealth(t, "f-dp-after", res, "Healthy", 60*time.Second)
	}
	c.deletePod(t, "f-dp-next")
	c.deletePod(t, "f-dp-after")
}
