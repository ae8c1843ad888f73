package e2e

import (
	"fmt"
	"testing"
	"time"
)

// Scenario b, repeated: the annotation-path grant, one pod after another, NRI_ACCEL_E2E_GRANTS
// times (default 100) per version and mode, each container seeing its device: every grant
// succeeds (issue 25 item 2: with CDI injection 2-5 % failed with "unresolvable CDI devices"
// because the spec was named in the reply that wrote it).
func TestB_RepeatedGrants(t *testing.T) {
	grants := envInt("NRI_ACCEL_E2E_GRANTS", 100)
	eachVersionAndMode(t, func(t *testing.T, v, mode string) {
		n := startNode(t, v, mode, NodeOptions{})
		failed := 0
		start := time.Now()
		for i := 0; i < grants; i++ {
			p := n.mustRunPod(t, fmt.Sprintf("grant-%d", i), annotation("app", exclusiveAsk))
			id, err := n.CRI.Run(p, "app")
			if err != nil {
				failed++
				t.Errorf("grant %d of %d: %v", i, grants, err)
			} else if view, err := n.viewDevice(t, id, n.Devs.Path(0)); err != nil || view.Minor != 0 {
				failed++
				t.Errorf("grant %d of %d: the container has no device: %+v %v", i, grants, view, err)
			}
			if err := n.CRI.RemovePod(p.ID); err != nil {
				t.Fatalf("grant %d: RemovePodSandbox: %v", i, err)
			}
		}
		t.Logf("%s/%s: %d of %d grants failed (%.0f ms per pod)", v, mode, failed, grants,
			float64(time.Since(start).Milliseconds())/float64(grants))
		if !waitFor(10*time.Second, func() bool { st, _ := n.Accel.Status(); return st != nil && len(st.Claims()) == 0 }) {
			t.Errorf("claims left: %v", n.status(t).Claims())
		}
		n.assertNothingHeld(t)
	})
}
