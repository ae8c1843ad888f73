package e2e

import (
	"testing"
	"time"
)

// Scenario h (containerd 2.2 and newer): with NRI's default validator on, every adjustment
// nri-accel makes passes it (a grant with CPUs runs, in both injection modes); and a refusal by
// the validator (a required plugin that is not there) reaches the CRI caller, and nothing stays
// held for the container nri-accel answered.
func TestH_DefaultValidator(t *testing.T) {
	eachVersionAndMode(t, func(t *testing.T, v, mode string) {
		probe := &Containerd{Version: v}
		if !probe.hasValidator() {
			t.Skipf("containerd %s has no NRI adjustment validation (2.2 and newer do)", v)
		}
		t.Run("passes", func(t *testing.T) {
			layout := defaultLayout(t, 1)
			n := startNode(t, v, mode, NodeOptions{Layout: layout, Validator: true})
			b := n.mustRunPod(t, "bystander", nil)
			bystander := n.mustRun(t, b, "idle")
			p := n.mustRunPod(t, "holder", annotation("app", exclusiveAsk))
			id, err := n.CRI.Run(p, "app")
			if err != nil {
				t.Fatalf("the default validator refused nri-accel's adjustment: %v", err)
			}
			if got := n.cpusInside(t, id); got != layout.LocalCPU {
				t.Errorf("cpuset %q, want %s", got, layout.LocalCPU)
			}
			if err := n.CRI.RemovePod(p.ID); err != nil {
				t.Fatal(err)
			}
			if !n.awaitCPUs(t, bystander, layout.CPUs) {
				t.Errorf("bystander's cpuset %q after the release, want %s", n.cpusInside(t, bystander), layout.CPUs)
			}
			n.assertNothingHeld(t)
		})
		t.Run("refusal", func(t *testing.T) {
			n := startNode(t, v, mode, NodeOptions{Validator: true, RequiredPlugins: []string{"e2e-absent"}})
			p := n.mustRunPod(t, "refused", annotation("app", exclusiveAsk))
			_, err := n.CRI.CreateContainer(p, "app")
			if err == nil {
				t.Fatal("the validator requiring an absent plugin let the container be created")
			}
			t.Logf("the validator's refusal at the CRI caller: %v", err)
			if !waitFor(10*time.Second, func() bool { st, _ := n.Accel.Status(); return st != nil && len(st.Claims()) == 0 }) {
				t.Errorf("nri-accel holds a claim for the container the validator refused: %v", n.status(t).Claims())
			}
			n.assertNothingHeld(t)
		})
	})
}
