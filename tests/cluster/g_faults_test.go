package cluster

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Scenario g, kill -9: nri-accel is killed the moment the scheduler has allocated a pod's claim
// (the kubelet's NodePrepareResources is then on its way or running) and started again 2 s
// later: the kubelet retries, the pod runs with the device, and nri-accel holds the claim once.
func scenarioGKill9(t *testing.T, c *Cluster) {
	c.apply(podYAML("g-kill", "one-gpu"))
	if !waitFor(60*time.Second, func() bool {
		p := c.pod("g-kill")
		for _, s := range list(p, "status", "resourceClaimStatuses") {
			out, err := c.kubectlErr("get", "resourceclaim", str(s, "resourceClaimName"), "-n", "default", "-o", "jsonpath={.status.allocation.devices.results[0].device}")
			if err == nil && out != "" {
				return true
			}
		}
		return false
	}) {
		t.Fatalf("g-kill's claim was not allocated:\n%s", c.kubectl("describe", "pod", "g-kill", "-n", "default"))
	}
	c.Accel.Kill()
	killed := time.Now()
	time.Sleep(2 * time.Second)
	c.Accel.start(t)
	c.waitAccelReady(t)
	t.Logf("nri-accel back %.1f s after the kill", time.Since(killed).Seconds())
	p := c.waitRunning(t, "g-kill", 180*time.Second)
	if got := allocatedDevices(c.claimOfPod(t, p)); len(got) != 1 || !strings.HasSuffix(got[0], "/whole-accel0") {
		t.Errorf("g-kill's claim allocated %v", got)
	}
	if n := len(c.accelClaims(t)); n != 1 {
		t.Errorf("nri-accel holds %d claims after the restart, want 1: %v", n, c.accelClaims(t))
	}
	if _, err := c.ExecIn("default", "g-kill", "app", "test", "-c", c.Devs.Path(0)); err != nil {
		t.Errorf("the device node is not in g-kill: %v", err)
	}
}

// Scenario g, API server down for 60 s under a running DRA pod: the pod keeps its device, nri-accel
// keeps the claim and its spec, and when the API server returns nri-accel publishes again (its
// publisher is back in sync, its slices on the server).
func scenarioGAPIServerDown(t *testing.T, c *Cluster) {
	if str(c.pod("g-kill"), "status", "phase") != "Running" {
		t.Fatal("needs g-kill running (the kill -9 scenario)")
	}
	specs := c.specFiles()
	c.APIServer.Stop(10 * time.Second)
	down := time.Now()
	time.Sleep(60 * time.Second)
	if _, err := c.ExecIn("default", "g-kill", "app", "test", "-c", c.Devs.Path(0)); err != nil {
		t.Errorf("g-kill lost its device while the API server was down: %v", err)
	}
	if n := len(c.accelClaims(t)); n != 1 {
		t.Errorf("nri-accel holds %d claims with the API server down, want 1", n)
	}
	for _, s := range specs {
		if _, err := os.Stat(filepath.Join(c.CDIDir, s)); err != nil {
			t.Errorf("spec %s gone while the API server was down", s)
		}
	}
	st, _ := c.AccelStatus()
	t.Logf("after %.0f s down, nri-accel's kubernetes status: state %v, last_error %v", time.Since(down).Seconds(),
		field(st, "kubernetes", "resource_slices", "state"), field(st, "kubernetes", "resource_slices", "last_error"))
	c.APIServer.start(t)
	if !waitFor(90*time.Second, func() bool {
		out, err := c.kubectlErr("get", "--raw", "/readyz")
		return err == nil && strings.TrimSpace(out) == "ok"
	}) {
		t.Fatalf("the API server did not come back:\n%s", tail(c.APIServer.Log, 30))
	}
	back := time.Now()
	if !waitFor(120*time.Second, func() bool {
		st, err := c.AccelStatus()
		return err == nil && field(st, "kubernetes", "resource_slices", "state") == "published" && field(st, "kubernetes", "resource_slices", "last_error") == nil
	}) {
		st, _ := c.AccelStatus()
		t.Errorf("nri-accel did not publish again after the API server returned: %v", field(st, "kubernetes"))
	}
	t.Logf("nri-accel in sync %.1f s after the API server was back", time.Since(back).Seconds())
	if n := len(list(c.getJSON(t, "get", "resourceslices", "--field-selector", "spec.driver=accel.nri.io"), "items")); n == 0 {
		t.Errorf("no slices on the server after the API server returned")
	}
	if ph := str(c.pod("g-kill"), "status", "phase"); ph != "Running" {
		t.Errorf("g-kill is %s after the outage", ph)
	}
}

// Scenario g, kubelet restart under a running DRA pod: nothing still in use is unprepared; the
// pod keeps running with its device and nri-accel keeps its claim and spec.
func scenarioGKubeletRestart(t *testing.T, c *Cluster) {
	specs := c.specFiles()
	held := c.accelClaims(t)
	c.Kubelet.Restart(t)
	if !waitFor(120*time.Second, c.nodeReady) {
		t.Fatalf("the node is not Ready after the kubelet restart:\n%s", tail(c.Kubelet.Log, 30))
	}
	time.Sleep(20 * time.Second) // the kubelet's pod workers and DRA manager resync
	if ph := str(c.pod("g-kill"), "status", "phase"); ph != "Running" {
		t.Errorf("g-kill is %s after the kubelet restart", ph)
	}
	now := c.accelClaims(t)
	for k := range held {
		if _, ok := now[k]; !ok {
			t.Errorf("claim %s was released by the kubelet restart while g-kill runs", k)
		}
	}
	for _, s := range specs {
		if _, err := os.Stat(filepath.Join(c.CDIDir, s)); err != nil {
			t.Errorf("spec %s gone after the kubelet restart", s)
		}
	}
	if _, err := c.ExecIn("default", "g-kill", "app", "test", "-c", c.Devs.Path(0)); err != nil {
		t.Errorf("g-kill lost its device after the kubelet restart: %v", err)
	}
	c.deletePod(t, "g-kill")
	if !waitFor(60*time.Second, func() bool { return len(c.accelClaims(t)) == 0 && len(c.specFiles()) == 0 }) {
		t.Errorf("after g-kill went nri-accel still holds %v, specs %v", c.accelClaims(t), c.specFiles())
	}
}

// Scenario g, a new DRA pod right after a kubelet restart (issue 39 item 0): a starting kubelet
// deletes every driver's ResourceSlices of its node and then registers the drivers again;
// nri-accel must publish them again at once (its resync is 10 minutes), so a pod with a claim
// created the moment the kubelet is restarted is scheduled and runs. Logs how long the slices
// and the pod took from the restart.
func scenarioGKubeletRestartNewPod(t *testing.T, c *Cluster) {
	devices, uids := c.nodeSlices()
	if devices == 0 {
		t.Fatalf("no devices of nri-accel on the server before the restart: %v", c.kubectl("get", "resourceslices", "-o", "wide"))
	}
	st, err := c.AccelStatus()
	must(t, err)
	republished := republishes(st)
	c.Kubelet.Restart(t)
	restarted := time.Now()
	c.apply(podYAML("g-new", "one-gpu"))
	// Back: nri-accel has published again since the restart, its watch sees on the server what it
	// published, and the server holds as many devices as before.
	if !waitFor(180*time.Second, func() bool {
		st, err := c.AccelStatus()
		if err != nil || republishes(st) <= republished {
			return false
		}
		if field(st, "kubernetes", "resource_slices", "server", "state") != "in-sync" {
			return false
		}
		n, _ := c.nodeSlices()
		return n == devices
	}) {
		st, _ := c.AccelStatus()
		n, _ := c.nodeSlices()
		t.Fatalf("180 s after the kubelet restart nri-accel has not published its slices again (%d of %d devices on the server); its status %v\nnri-accel:\n%s\nkubelet:\n%s",
			n, devices, field(st, "kubernetes"), tail(c.accelLog(), 30), tail(c.Kubelet.Log, 30))
	}
	back := time.Since(restarted)
	_, after := c.nodeSlices()
	wiped := true
	for uid := range uids {
		if after[uid] {
			wiped = false
		}
	}
	// Well under the resync: the pod waits for the slices, then for the scheduler's backoff.
	p := c.waitRunning(t, "g-new", 150*time.Second)
	running := time.Since(restarted)
	st, _ = c.AccelStatus()
	t.Logf("kubelet restart: slices wiped by the kubelet %v; back on the server %.1f s after the restart, g-new Running after %.1f s (nri-accel: %v republishes for the kubelet's registration, %v for a difference on the server)",
		wiped, back.Seconds(), running.Seconds(), field(st, "kubernetes", "resource_slices", "registrations"), field(st, "kubernetes", "resource_slices", "repairs"))
	if got := allocatedDevices(c.claimOfPod(t, p)); len(got) != 1 || !strings.HasSuffix(got[0], "/whole-accel0") {
		t.Errorf("g-new's claim allocated %v, want whole-accel0", got)
	}
	if _, err := c.ExecIn("default", "g-new", "app", "test", "-c", c.Devs.Path(0)); err != nil {
		t.Errorf("the device node is not in g-new: %v", err)
	}
	c.deletePod(t, "g-new")
	if !waitFor(60*time.Second, func() bool { return len(c.accelClaims(t)) == 0 && len(c.specFiles()) == 0 }) {
		t.Errorf("after g-new went nri-accel still holds %v, specs %v", c.accelClaims(t), c.specFiles())
	}

	// The same deletion by hand, with no registration to follow it: nri-accel's watch of its
	// slices on the real API server sees it and publishes them again.
	st, err = c.AccelStatus()
	must(t, err)
	repairs, _ := field(st, "kubernetes", "resource_slices", "repairs").(float64)
	c.kubectl("delete", "resourceslices", "--field-selector", "spec.driver=accel.nri.io,spec.nodeName="+nodeName)
	deleted := time.Now()
	if !waitFor(120*time.Second, func() bool {
		st, err := c.AccelStatus()
		r, _ := field(st, "kubernetes", "resource_slices", "repairs").(float64)
		n, _ := c.nodeSlices()
		return err == nil && r > repairs && n == devices &&
			field(st, "kubernetes", "resource_slices", "server", "state") == "in-sync"
	}) {
		st, _ := c.AccelStatus()
		t.Fatalf("120 s after the slices were deleted by hand nri-accel's watch has not put them back; its status %v\nnri-accel:\n%s",
			field(st, "kubernetes"), tail(c.accelLog(), 30))
	}
	t.Logf("slices deleted by hand: back %.1f s later (the watch's repair)", time.Since(deleted).Seconds())
}

// nodeSlices answers the devices in nri-accel's ResourceSlices of the node as the server holds
// them, and the slices' UIDs (0 and none when the server cannot be read).
func (c *Cluster) nodeSlices() (int, map[string]bool) {
	out, err := c.kubectlErr("get", "resourceslices", "--field-selector",
		"spec.driver=accel.nri.io,spec.nodeName="+nodeName, "-o", "json")
	uids := map[string]bool{}
	if err != nil {
		return 0, uids
	}
	var o obj
	if json.Unmarshal([]byte(out), &o) != nil {
		return 0, uids
	}
	n := 0
	for _, s := range list(o, "items") {
		n += len(list(s, "spec", "devices"))
		uids[str(s, "metadata", "uid")] = true
	}
	return n, uids
}

// republishes answers how often nri-accel published its slices anew because the kubelet
// registered the driver or the server's copy differed (`status --json`).
func republishes(st map[string]any) float64 {
	r, _ := field(st, "kubernetes", "resource_slices", "registrations").(float64)
	d, _ := field(st, "kubernetes", "resource_slices", "repairs").(float64)
	return r + d
}
