package cluster

import (
	"strings"
	"testing"
	"time"
)

// Scenario h, extended resources served by a DeviceClass (KEP-5004): a DeviceClass naming an
// extended resource lets a pod ask `example.com/accel: 1` in its limits, as it would a device
// plugin's resource; the scheduler makes the claim from nri-accel's slices and the kubelet
// prepares it through nri-accel's DRA driver. GA in 1.37; on 1.34 the alpha gate is on.
func TestClusterExtendedResource(t *testing.T) {
	requireRoot(t)
	for _, v := range kubeVersions() {
		t.Run(v, func(t *testing.T) {
			c := Start(t, v, Options{})
			c.apply(`apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: accel-gpu-extended}
spec:
  extendedResourceName: example.com/accel
  selectors:
    - cel:
        expression: >-
          device.driver == "accel.nri.io" &&
          device.attributes["accel.nri.io"].type == "device" &&
          device.attributes["accel.nri.io"].family == "exclusive"
`)
			c.apply(dpPodYAML("h-extended", "example.com/accel", 1))
			p := c.waitRunning(t, "h-extended", 120*time.Second)
			var claim string
			for _, s := range list(p, "status", "extendedResourceClaimStatus", "requestMappings") {
				t.Logf("request mapping: %v", s)
			}
			claim = str(p, "status", "extendedResourceClaimStatus", "resourceClaimName")
			if claim == "" {
				t.Fatalf("the pod has no extended resource claim: %v", field(p, "status"))
			}
			got := allocatedDevices(c.getJSON(t, "get", "resourceclaim", claim, "-n", "default"))
			if len(got) != 1 || !strings.HasSuffix(got[0], "/whole-accel0") {
				t.Errorf("claim %s allocated %v, want whole-accel0", claim, got)
			}
			if _, err := c.ExecIn("default", "h-extended", "app", "test", "-c", c.Devs.Path(0)); err != nil {
				t.Errorf("the device node is not in h-extended: %v", err)
			}
			cpus, err := c.ExecIn("default", "h-extended", "app", "grep", "Cpus_allowed_list", "/proc/self/status")
			must(t, err)
			if f := strings.Fields(cpus); len(f) != 2 || f[1] != c.LocalCPU {
				t.Errorf("cpuset inside %q, want the device's NUMA-local CPU %s", cpus, c.LocalCPU)
			}
			c.deletePod(t, "h-extended")
			if !waitFor(60*time.Second, func() bool { return len(c.accelClaims(t)) == 0 && len(c.specFiles()) == 0 }) {
				t.Errorf("after h-extended went nri-accel still holds %v, specs %v", c.accelClaims(t), c.specFiles())
			}
		})
	}
}
