package e2e

import (
	"strings"
	"testing"
)

// Scenario e: shared and sliced pools. Two containers share shared0 (2 replicas), each seeing its
// node and the share's memory limit; a third is refused. Two containers get the two slices of
// sliced0: the device's node and distinct slice starts (this project's slices share the device's
// nodes and tell the slice by env); a third is refused.
func TestE_SharedAndSlicedPools(t *testing.T) {
	eachVersionAndMode(t, func(t *testing.T, v, mode string) {
		n := startNode(t, v, mode, NodeOptions{})
		wantMinor := map[string]int64{"shared": int64(wholeDevices(n)), "sliced": int64(wholeDevices(n) + 1)}
		asks := map[string]string{"shared": "family=shared", "sliced": "family=sliced,profile=half"}
		for _, family := range []string{"shared", "sliced"} {
			starts := map[string]bool{}
			for i := 0; i < 3; i++ {
				p := n.mustRunPod(t, family, annotation("app", asks[family]))
				id, err := n.CRI.Run(p, "app")
				if i == 2 {
					if err == nil {
						t.Errorf("%s: a third container got a unit of a device with two", family)
					} else if !strings.Contains(err.Error(), "refused") {
						t.Errorf("%s: the third container's error %q is not nri-accel's refusal", family, err)
					}
					continue
				}
				if err != nil {
					t.Fatalf("%s: container %d: %v", family, i, err)
				}
				path := n.Devs.Path(int(wantMinor[family]))
				view, err := n.viewDevice(t, id, path)
				if err != nil || view.Minor != wantMinor[family] || !strings.Contains(view.Open, "No such device or address") {
					t.Errorf("%s: container %d's device %s: %+v %v", family, i, path, view, err)
				}
				env := n.envInside(t, id)
				switch family {
				case "shared":
					if env["ACCEL_SHARE_MEMORY_LIMIT_MIB"] != "8192" {
						t.Errorf("shared: container %d's env has ACCEL_SHARE_MEMORY_LIMIT_MIB=%q, want 8192", i, env["ACCEL_SHARE_MEMORY_LIMIT_MIB"])
					}
				case "sliced":
					if env["ACCEL_SLICE_PROFILE"] != "half" || env["ACCEL_SLICE_START"] == "" {
						t.Errorf("sliced: container %d's slice env: profile %q start %q", i, env["ACCEL_SLICE_PROFILE"], env["ACCEL_SLICE_START"])
					}
					if starts[env["ACCEL_SLICE_START"]] {
						t.Errorf("sliced: slice start %s given twice", env["ACCEL_SLICE_START"])
					}
					starts[env["ACCEL_SLICE_START"]] = true
				}
			}
		}
		n.assertNoDoubleGrant(t)
	})
}
