package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const exclusiveAsk = "count=1,family=exclusive"

// Scenario b: a pod asking for an exclusive device through its annotation runs, and from inside
// the container the device node (type, major:minor, mode, the device cgroup letting it through),
// the environment of the grant and the NUMA-local cpuset are what the policy granted.
func TestB_AnnotationGrantSeenInside(t *testing.T) {
	eachVersionAndMode(t, func(t *testing.T, v, mode string) {
		layout := defaultLayout(t, 1)
		n := startNode(t, v, mode, NodeOptions{Layout: layout})
		p := n.mustRunPod(t, "holder", annotation("app", exclusiveAsk))
		id := n.mustRun(t, p, "app")

		st := n.status(t)
		claim := claimOf(st, id)
		if claim == nil {
			t.Fatalf("no claim for container %s in status: %v", id, st.Claims())
		}
		if got := deviceIDs(claim); len(got) != 1 || got[0] != "accel0" {
			t.Fatalf("claim devices %v, want [accel0]", got)
		}
		view, err := n.viewDevice(t, id, n.Devs.Path(0))
		if err != nil {
			t.Fatalf("device node inside: %v", err)
		}
		want := DeviceView{Type: "character special file", Major: int64(n.Devs.Major), Minor: 0, Mode: "666",
			Open: "No such device or address"}
		if view.Type != want.Type || view.Major != want.Major || view.Minor != want.Minor || view.Mode != want.Mode {
			t.Errorf("device node inside: %+v, want %+v", *view, want)
		}
		if !strings.Contains(view.Open, want.Open) {
			t.Errorf("opening the device inside says %q, want %q (the device cgroup must let it through)", view.Open, want.Open)
		}
		// No other fake device is there.
		if out, err := n.CRI.Exec(id, "ls", filepath.Dir(n.Devs.Path(0))); err != nil || strings.TrimSpace(out) != "accel0" {
			t.Errorf("fake devices inside: %q %v, want only accel0", out, err)
		}
		// The env of the grant's CDI spec is in the container.
		env := n.envInside(t, id)
		for k, v := range specEnv(t, n) {
			if env[k] != v {
				t.Errorf("env %s=%q inside, the grant says %q", k, env[k], v)
			}
		}
		if got := n.cpusInside(t, id); got != layout.LocalCPU {
			t.Errorf("cpuset inside %q, want the device's NUMA-local CPU %q", got, layout.LocalCPU)
		}
	})
}

// specEnv answers the env of every CDI spec nri-accel has written.
func specEnv(t *testing.T, n *Node) map[string]string {
	env := map[string]string{}
	for _, f := range n.Accel.SpecFiles() {
		b, err := os.ReadFile(filepath.Join(n.Accel.CDIDir, f))
		must(t, err)
		inEnv := false
		for _, l := range strings.Split(string(b), "\n") {
			trimmed := strings.TrimSpace(l)
			switch {
			case strings.HasSuffix(trimmed, "env:"):
				inEnv = true
			case inEnv && strings.HasPrefix(trimmed, "- "):
				kv := strings.Trim(strings.TrimPrefix(trimmed, "- "), `"'`)
				if k, v, ok := strings.Cut(kv, "="); ok {
					env[k] = v
				}
			default:
				inEnv = false
			}
		}
	}
	return env
}

// holderAndBystander starts a node with one exclusive device and one CPU given with it, a
// bystander pod without devices and a holder of accel0.
func holderAndBystander(t *testing.T, v, mode string) (n *Node, layout Layout, bystander, holderPod string, holder string) {
	layout = defaultLayout(t, 1)
	n = startNode(t, v, mode, NodeOptions{Layout: layout})
	bp := n.mustRunPod(t, "bystander", nil)
	bystander = n.mustRun(t, bp, "idle")
	hp := n.mustRunPod(t, "holder", annotation("app", exclusiveAsk))
	holder = n.mustRun(t, hp, "app")
	return n, layout, bystander, hp.ID, holder
}

// Scenario c: a second pod asking for the held device is refused at CreateContainer; the
// project's refusal text reaches the CRI caller; nothing is held or written for it.
func TestC_SecondPodRefused(t *testing.T) {
	eachVersionAndMode(t, func(t *testing.T, v, mode string) {
		n, _, _, _, holder := holderAndBystander(t, v, mode)
		before := n.Accel.SpecFiles()
		p := n.mustRunPod(t, "second", annotation("app", exclusiveAsk))
		_, err := n.CRI.CreateContainer(p, "app")
		if err == nil {
			t.Fatal("a second pod asking for the held exclusive device was created")
		}
		if !strings.Contains(err.Error(), "refused") || !strings.Contains(err.Error(), "claim ctr-") {
			t.Errorf("the CRI caller got %q; want nri-accel's refusal (\"claim ctr-… refused: …\")", err)
		}
		t.Logf("refusal at the CRI caller: %v", err)
		// It names the device and its holder (issue 25 item 6).
		if !strings.Contains(err.Error(), "accel0 is held by claim ctr-") || !strings.Contains(err.Error(), "(e2e/holder/app)") {
			t.Errorf("the refusal %q does not name accel0 and its holder e2e/holder/app", err)
		}
		st := n.status(t)
		if len(st.Claims()) != 1 || claimOf(st, holder) == nil {
			t.Errorf("claims after the refusal: %v; want only the holder's", st.Claims())
		}
		if after := n.Accel.SpecFiles(); strings.Join(after, ",") != strings.Join(before, ",") {
			t.Errorf("spec files %v after the refusal, %v before", after, before)
		}
		ctrs, _ := n.CRI.Containers()
		for _, c := range ctrs {
			if c.PodSandboxId == p.ID {
				t.Errorf("the refused container exists: %v", c)
			}
		}
		n.assertNoDoubleGrant(t)
	})
}

// Scenario d: the first pod removed: the device and its CPU return, the refused pod's retry
// runs with the device, the bystander gets the freed CPU back, and nri-accel stays connected.
func TestD_ReleaseRetryAndBystander(t *testing.T) {
	eachVersionAndMode(t, func(t *testing.T, v, mode string) {
		n, layout, bystander, holderPod, _ := holderAndBystander(t, v, mode)
		all := layout.CPUs
		if got, want := n.cpusInside(t, bystander), cpusWithout(t, all, layout.LocalCPU); got != want {
			t.Errorf("bystander's cpuset %q while the holder has CPU %s, want %q", got, layout.LocalCPU, want)
		}
		p := n.mustRunPod(t, "second", annotation("app", exclusiveAsk))
		if _, err := n.CRI.CreateContainer(p, "app"); err == nil {
			t.Fatal("the held device was granted twice")
		}
		if err := n.CRI.RemovePod(holderPod); err != nil {
			t.Fatalf("removing the holder: %v", err)
		}
		if !waitFor(10*time.Second, func() bool { st, _ := n.Accel.Status(); return st != nil && len(st.Claims()) == 0 }) {
			t.Fatalf("the holder's claim was not released: %v", n.status(t).Claims())
		}
		n.assertNothingHeld(t)
		if !n.awaitCPUs(t, bystander, all) {
			t.Errorf("bystander's cpuset %q after the release, want all CPUs %s", n.cpusInside(t, bystander), all)
		}
		id, err := n.CRI.Run(p, "app")
		if err != nil {
			t.Fatalf("the retry after the release failed: %v", err)
		}
		if got := n.cpusInside(t, id); got != layout.LocalCPU {
			t.Errorf("retry's cpuset %q, want %s", got, layout.LocalCPU)
		}
		if view, err := n.viewDevice(t, id, n.Devs.Path(0)); err != nil || view.Minor != 0 {
			t.Errorf("retry's device: %+v %v", view, err)
		}
		// The runtime never dropped the plugin (1.7.0 drops one that misses its request timeout).
		if !n.status(t).GateOpen() || !n.Accel.Running() || fileContains(n.Accel.Log, "NRI connection lost") {
			t.Errorf("nri-accel lost its connection:\n%s", tail(n.Accel.Log, 20))
		}
		n.assertNoDoubleGrant(t)
	})
}
