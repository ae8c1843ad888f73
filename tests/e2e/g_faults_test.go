package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// Scenario g1: kill -9 nri-accel while a container holds a device, start it again: the holder
// is re-adopted (its claim is back, on the same device), the gate opens after Synchronize,
// nothing is granted twice, and removing the holder releases the device.
func TestG_Kill9WhileHolding(t *testing.T) {
	eachVersionAndMode(t, func(t *testing.T, v, mode string) {
		n, layout, bystander, holderPod, holder := holderAndBystander(t, v, mode)
		n.Accel.Kill9()
		n.Accel.Start(t)
		st := n.status(t)
		if len(st.Claims()) != 1 || st.Held()["accel0"] == nil {
			t.Fatalf("after the restart: claims %v, held %v; want the holder's claim on accel0", st.Claims(), st.Held())
		}
		p := n.mustRunPod(t, "second", annotation("app", exclusiveAsk))
		if id, err := n.CRI.Run(p, "app"); err == nil {
			t.Fatalf("double grant after the restart: %s got a device while %s holds accel0", id, holder)
		}
		n.assertNoDoubleGrant(t)
		if got, want := n.cpusInside(t, bystander), cpusWithout(t, layout.CPUs, layout.LocalCPU); got != want {
			t.Errorf("bystander's cpuset %q after the restart, want %q", got, want)
		}
		if err := n.CRI.RemovePod(holderPod); err != nil {
			t.Fatal(err)
		}
		if !waitFor(10*time.Second, func() bool { st, _ := n.Accel.Status(); return st != nil && len(st.Claims()) == 0 }) {
			t.Fatalf("the re-adopted claim was not released with its container: %v", n.status(t).Claims())
		}
		n.assertNothingHeld(t)
	})
}

// Scenario g2: containerd restarted under running containers and a running nri-accel: nri-accel
// reconnects (gate open again), the holder keeps its device, and a release after it works.
func TestG_ContainerdRestart(t *testing.T) {
	eachVersionAndMode(t, func(t *testing.T, v, mode string) {
		n, _, _, holderPod, holder := holderAndBystander(t, v, mode)
		n.RestartContainerd(t)
		if !waitFor(30*time.Second, func() bool { st, _ := n.Accel.Status(); return st != nil && st.GateOpen() }) {
			t.Fatalf("nri-accel did not reconnect after containerd's restart:\n%s", tail(n.Accel.Log, 20))
		}
		if !n.Accel.Running() {
			t.Fatal("nri-accel exited when containerd restarted")
		}
		if st := n.status(t); claimOf(st, holder) == nil {
			t.Fatalf("the holder's claim is gone after containerd's restart: %v", st.Claims())
		}
		p := n.mustRunPod(t, "second", annotation("app", exclusiveAsk))
		if _, err := n.CRI.Run(p, "app"); err == nil {
			t.Fatal("double grant after containerd's restart")
		}
		if err := n.CRI.RemovePod(holderPod); err != nil {
			t.Fatal(err)
		}
		if !waitFor(10*time.Second, func() bool { st, _ := n.Accel.Status(); return st != nil && len(st.Claims()) == 0 }) {
			t.Fatalf("no release after containerd's restart: %v", n.status(t).Claims())
		}
		again := n.mustRunPod(t, "again", annotation("app", exclusiveAsk))
		id, err := n.CRI.Run(again, "app")
		if err != nil {
			t.Fatalf("a grant after containerd's restart: %v", err)
		}
		if view, err := n.viewDevice(t, id, n.Devs.Path(0)); err != nil || view.Minor != 0 {
			t.Errorf("device after containerd's restart: %+v %v", view, err)
		}
	})
}

// Scenario g3: a pod started while nri-accel is down. What the user sees (documented in
// docs/operator-guide.md): containerd runs it without the device its annotation asks for, and
// no error reaches the CRI caller. When nri-accel comes back, it must say so at Synchronize
// (issue 25 item 4): its log names the container whose ask is unmet.
func TestG_PodWhileNriAccelDown(t *testing.T) {
	eachVersion(t, func(t *testing.T, v string) {
		n := startNode(t, v, "device-nodes", NodeOptions{})
		n.Accel.Stop()
		p := n.mustRunPod(t, "orphan", annotation("app", exclusiveAsk))
		id, err := n.CRI.Run(p, "app")
		if err != nil {
			t.Logf("while nri-accel is down, the create failed: %v", err)
			return
		}
		_, serr := n.CRI.Exec(id, "stat", n.Devs.Path(0))
		t.Logf("while nri-accel is down: the container runs; its device node: %v", serr)
		if serr == nil {
			t.Errorf("the container got the device with nri-accel down")
		}
		n.Accel.Start(t)
		if !fileContains(n.Accel.Log, id[:12]) {
			t.Errorf("after the restart nri-accel's log does not name container %s, whose ask is unmet:\n%s", id,
				strings.TrimSpace(tail(n.Accel.Log, 15)))
		}
		unmet, _ := n.status(t)["unmet_asks"].(map[string]any)
		if _, ok := unmet[id]; !ok {
			t.Errorf("status's unmet_asks %v does not list container %s", unmet, id)
		}
	})
}

// Scenario g3, made required (containerd 2.2 and newer): with the default validator requiring
// plugin "accel", creates are refused while nri-accel is down instead of running without the
// device. Records how many creates pass before containerd notices the plugin is gone.
func TestG_RequiredPluginWhileDown(t *testing.T) {
	eachVersion(t, func(t *testing.T, v string) {
		if !(&Containerd{Version: v}).hasValidator() {
			t.Skipf("containerd %s has no NRI adjustment validation (2.2 and newer do)", v)
		}
		n := startNode(t, v, "device-nodes", NodeOptions{Validator: true, RequiredPlugins: []string{"accel"}})
		p := n.mustRunPod(t, "first", annotation("app", exclusiveAsk))
		n.mustRun(t, p, "app")
		n.Accel.Stop()
		passed := 0
		var err error
		for i := 0; i < 5; i++ {
			q := n.mustRunPod(t, fmt.Sprintf("down-%d", i), nil)
			if _, err = n.CRI.CreateContainer(q, "app"); err != nil {
				break
			}
			passed++
		}
		t.Logf("required plugin down: %d create(s) passed before the refusal %v", passed, err)
		if err == nil || !strings.Contains(err.Error(), `required plugin "accel" not present`) {
			t.Errorf("5 creates with the required plugin down: the last error is %v", err)
		}
	})
}
