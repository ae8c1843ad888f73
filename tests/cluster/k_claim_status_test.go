package cluster

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// Scenario k, what nri-accel tells the API server beyond its slices:
//
//   - KEP-4817 per-device status: a pod's claim, once prepared, carries nri-accel's entry in
//     `status.devices` (driver, pool, device, a Ready condition, the CDI device ids), written with
//     the shipped RBAC (on 1.36+ the granular resourceclaims/driver check included); deleting the
//     pod clears it. An API server outage is covered by the fast test
//     (plugin/tests/e2e_dra_claim_status.rs): here nothing is prepared while the server is down.
//   - KEP-6072: every device carries the standard resource.kubernetes.io/numaNode in the form the
//     API server accepted (a list with DRAListTypeAttributes, else the scalar), beside
//     accel.nri.io's own, and a claim selecting on the standard one runs. With the default gates
//     every version tested answers scalar; on 1.36+ a second cluster with the alpha gate on in
//     the apiserver and scheduler answers list (not on CI's 1.34, which has no such gate).
func TestClusterClaimStatus(t *testing.T) {
	requireRoot(t)
	for _, v := range kubeVersions() {
		t.Run(v, func(t *testing.T) {
			c := Start(t, v, Options{})
			c.waitAccelReady(t)
			standardNUMA(t, c, "scalar")
			claimStatus(t, c)
		})
		var major, minor int
		fmt.Sscanf(v, "v%d.%d", &major, &minor)
		if minor < 36 {
			continue
		}
		t.Run(v+"/DRAListTypeAttributes", func(t *testing.T) {
			c := Start(t, v, Options{ExtraGates: []string{"DRAListTypeAttributes"}})
			c.waitAccelReady(t)
			standardNUMA(t, c, "list")
		})
	}
}

// standardNUMA checks the published attribute, and selects a device with it.
func standardNUMA(t *testing.T, c *Cluster, want string) {
	st, err := c.AccelStatus()
	must(t, err)
	form := str(st, "kubernetes", "resource_slices", "numa_node_attribute")
	t.Logf("the API server answered: resource.kubernetes.io/numaNode published as %q (DRAListTypeAttributes: %q)",
		form, c.Gates["DRAListTypeAttributes"])
	if form != want {
		t.Fatalf("status says numa_node_attribute %q, want %s: %v", form, want, field(st, "kubernetes", "resource_slices"))
	}
	devices := c.publishedDevices(t)
	if len(devices) == 0 {
		t.Fatal("no devices published")
	}
	var node any
	for name, d := range devices {
		std := field(d, "attributes", "resource.kubernetes.io/numaNode")
		own := field(d, "attributes", "numaNode", "int")
		if own == nil {
			t.Errorf("device %s has no accel.nri.io numaNode: %v", name, field(d, "attributes"))
			continue
		}
		node = own
		switch form {
		case "list":
			if l := list(std, "ints"); len(l) == 0 || l[0] != own {
				t.Errorf("device %s: standard numaNode %v, want a list starting with %v", name, std, own)
			}
		case "scalar":
			if got := field(std, "int"); got != own {
				t.Errorf("device %s: standard numaNode %v, want int %v", name, std, own)
			}
		}
	}
	// A claim selecting on the standard attribute is allocated and prepared.
	cel := fmt.Sprintf(`device.attributes["resource.kubernetes.io"].numaNode == %v`, node)
	if form == "list" {
		cel = fmt.Sprintf(`device.attributes["resource.kubernetes.io"].numaNode.includes(%v)`, node)
	}
	c.apply(claimTemplateYAML("k-numa", oneDevice("accel-gpu", cel, "")))
	c.apply(podYAML("k-numa", "k-numa"))
	c.waitRunning(t, "k-numa", 120*time.Second)
	c.deletePod(t, "k-numa")
	if !waitFor(60*time.Second, func() bool { return len(c.accelClaims(t)) == 0 }) {
		t.Fatalf("after k-numa went nri-accel still holds %v", c.accelClaims(t))
	}
}

// ourEntries answers the claim's status.devices entries of driver accel.nri.io.
func ourEntries(claim obj) []any {
	var out []any
	for _, e := range list(claim, "status", "devices") {
		if str(e, "driver") == "accel.nri.io" {
			out = append(out, e)
		}
	}
	return out
}

// waitStatusEntry waits until claim (namespace default) holds nri-accel's status.devices entry
// (scenario b on the host and in the DaemonSet's pod, with that pod's own token).
func (c *Cluster) waitStatusEntry(t *testing.T, claim string) {
	t.Helper()
	var got obj
	if !waitFor(30*time.Second, func() bool {
		got = c.getJSON(t, "get", "resourceclaim", claim, "-n", "default")
		return len(ourEntries(got)) == 1
	}) {
		st, _ := c.AccelStatus()
		t.Errorf("claim %s has no status.devices entry of nri-accel: %v; nri-accel: %v",
			claim, field(got, "status", "devices"), field(st, "kubernetes", "claim_status"))
	}
}

// claimStatus runs a pod with a named claim and follows the claim's status.devices.
func claimStatus(t *testing.T, c *Cluster) {
	c.apply(claimYAML("k-claim", oneDevice("accel-gpu", "", "")))
	pod := strings.Replace(podYAML("k-status", "x"), "resourceClaimTemplateName: x", "resourceClaimName: k-claim", 1)
	c.apply(pod)
	c.waitRunning(t, "k-status", 120*time.Second)
	start := time.Now()
	var claim obj
	if !waitFor(30*time.Second, func() bool {
		claim = c.getJSON(t, "get", "resourceclaim", "k-claim", "-n", "default")
		return len(ourEntries(claim)) == 1
	}) {
		st, _ := c.AccelStatus()
		t.Fatalf("k-claim has no status.devices entry of nri-accel: %v\nnri-accel: %v\n%s",
			field(claim, "status"), field(st, "kubernetes", "claim_status"), tail(c.accelLog(), 20))
	}
	t.Logf("status.devices written %.1f s after the pod ran", time.Since(start).Seconds())
	e := ourEntries(claim)[0]
	alloc := allocatedDevices(claim)
	if got := fmt.Sprintf("accel.nri.io/%s/%s", str(e, "pool"), str(e, "device")); len(alloc) != 1 || got != alloc[0] {
		t.Errorf("entry names %s, the allocation %v", got, alloc)
	}
	ready := field(e, "conditions", 0)
	if str(ready, "type") != "Ready" || str(ready, "status") != "True" || str(ready, "reason") != "Prepared" {
		t.Errorf("entry's condition %v, want Ready True Prepared", ready)
	}
	ids := list(e, "data", "cdiDeviceIDs")
	if len(ids) != 1 || !strings.HasPrefix(fmt.Sprint(ids[0]), "accel.nri.io/device=claim-") {
		t.Errorf("entry's data %v, want the claim's CDI device id", field(e, "data"))
	}
	// As an operator reads it.
	yaml := c.kubectl("get", "resourceclaim", "k-claim", "-n", "default", "-o", "yaml")
	if !strings.Contains(yaml, "reason: Prepared") || !strings.Contains(yaml, "driver: accel.nri.io") {
		t.Errorf("kubectl get resourceclaim -o yaml shows no entry:\n%s", yaml)
	}
	t.Logf("k-claim status.devices: %v", field(claim, "status", "devices"))

	// The pod goes: the entry goes with the unprepare (or the deallocation that follows it).
	c.deletePod(t, "k-status")
	if !waitFor(60*time.Second, func() bool {
		return len(ourEntries(c.getJSON(t, "get", "resourceclaim", "k-claim", "-n", "default"))) == 0
	}) {
		t.Errorf("k-claim still has nri-accel's entry after its pod went: %v",
			field(c.getJSON(t, "get", "resourceclaim", "k-claim", "-n", "default"), "status"))
	}
	var st map[string]any
	if !waitFor(30*time.Second, func() bool {
		st, _ = c.AccelStatus()
		return field(st, "kubernetes", "claim_status", "pending") == float64(0) &&
			field(st, "kubernetes", "claim_status", "cleared") != float64(0)
	}) {
		t.Errorf("nri-accel's claim status writer: %v", field(st, "kubernetes", "claim_status"))
	}
	if f := field(st, "kubernetes", "claim_status", "failed"); f != float64(0) {
		t.Errorf("status writes failed: %v", field(st, "kubernetes", "claim_status"))
	}
	c.kubectl("delete", "resourceclaim", "k-claim", "-n", "default")
}
