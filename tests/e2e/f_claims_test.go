package e2e

import (
	"strings"
	"testing"
	"time"
)

// cdiAnnotation asks containerd's own CDI injection for a CDI device (containerd reads
// cdi.k8s.io/* container annotations when enable_cdi is on, 1.7 and 2.x alike).
func cdiAnnotation(device string) map[string]string {
	return map[string]string{"cdi.k8s.io/e2e": device}
}

// Scenario f: a claim prepared through the claims API; containerd's own CDI injection (enable_cdi,
// cdi_spec_dirs) gives a container the device; an unprepare while that container runs must not
// let the device be granted twice; after the container is gone, unprepare removes the spec and a
// container created then is refused the device cleanly.
func TestF_ClaimsAPIWithContainerdCDI(t *testing.T) {
	eachVersion(t, func(t *testing.T, v string) {
		n := startNode(t, v, modes(v)[0], NodeOptions{})
		out, errs, err := n.Accel.CLI("prepare", "u1", "--device", "accel0")
		if err != nil {
			t.Fatalf("prepare u1: %v: %s", err, errs)
		}
		fields := strings.Fields(out)
		if len(fields) != 3 || fields[2] == "" {
			t.Fatalf("prepare answered %q; want <pool> <device> <cdi ids>", out)
		}
		cdiDevice := fields[2]
		if len(n.Accel.SpecFiles()) != 1 {
			t.Fatalf("spec files after prepare: %v", n.Accel.SpecFiles())
		}

		p := n.mustRunPod(t, "claimed", nil)
		id, err := n.CRI.CreateContainerAnnotated(p, "app", cdiAnnotation(cdiDevice))
		if err == nil {
			err = n.CRI.StartContainer(id)
		}
		if err != nil {
			t.Fatalf("container with CDI device %s: %v", cdiDevice, err)
		}
		view, err := n.viewDevice(t, id, n.Devs.Path(0))
		if err != nil || view.Type != "character special file" || view.Major != int64(n.Devs.Major) || view.Minor != 0 {
			t.Fatalf("containerd's CDI injection of %s: %+v %v", cdiDevice, view, err)
		}

		// Unprepare while the container uses the claim: either refused (naming the container),
		// or the device stays held until the container goes. Never a second holder.
		out, errs, uerr := n.Accel.CLI("unprepare", "u1")
		t.Logf("unprepare while in use: err=%v stdout=%q stderr=%q", uerr, out, errs)
		q := n.mustRunPod(t, "next", annotation("app", exclusiveAsk))
		if id2, err := n.CRI.Run(q, "app"); err == nil {
			t.Errorf("double grant: container %s got accel0 while %s (claim u1, unprepared with %q) uses it", id2, id, out)
			n.assertNoDoubleGrant(t)
			// Out of the way, so that what follows is checked on its own.
			if err := n.CRI.RemovePod(q.ID); err != nil {
				t.Fatal(err)
			}
		}

		if err := n.CRI.RemoveContainer(id); err != nil {
			t.Fatalf("removing the claim's container: %v", err)
		}
		if out, errs, err := n.Accel.CLI("unprepare", "u1"); err != nil {
			t.Fatalf("unprepare u1 after its container is gone: %v: %s %s", err, out, errs)
		}
		if !waitFor(5*time.Second, func() bool { return len(n.Accel.SpecFiles()) == 0 }) {
			t.Errorf("spec files after unprepare: %v", n.Accel.SpecFiles())
		}
		n.assertNothingHeld(t)
		_, err = n.CRI.CreateContainerAnnotated(p, "late", cdiAnnotation(cdiDevice))
		if err == nil {
			t.Errorf("a container asking for the unprepared %s was created", cdiDevice)
		} else {
			t.Logf("what a container asking for the unprepared claim sees: %v", err)
		}
	})
}
