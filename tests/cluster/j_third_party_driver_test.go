package cluster

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The example driver's name (examples/go-dra-driver), and its DeviceClass here.
const (
	extDriver = "gpu.example.com"
	extClass  = "example-gpu"
)

// TestClusterThirdPartyDriver runs the example third-party DRA driver (examples/go-dra-driver,
// built on the upstream kubeletplugin helper, delegating to nri-accel through the Go client)
// beside nri-accel's own DRA driver on one node, each with its own kubelet plugin registration,
// ResourceSlice pool and DeviceClass, both publishing the node's two whole devices (issue 38,
// item 2): a pod through each driver runs with its device; claims of both drivers for one
// device are never both prepared (the second is refused naming the first and runs once the
// first pod is gone); kill -9 of nri-accel and of the driver while both prepare leaves nothing
// held twice or leaked.
func TestClusterThirdPartyDriver(t *testing.T) {
	requireRoot(t)
	bin := buildExampleDriver(t)
	for _, v := range kubeVersions() {
		t.Run(v, func(t *testing.T) {
			start := time.Now()
			// Two whole devices held at once: no exclusive CPUs (the policy keeps one CPU shared).
			c := Start(t, v, Options{WholeDevices: 2, NoExclusiveCPUs: true})
			x := c.startExampleDriver(t, bin)
			c.apply(fmt.Sprintf(`apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: %s}
spec:
  selectors:
    - cel: {expression: 'device.driver == "%s"'}
`, extClass, extDriver))
			for _, d := range []string{"accel0", "accel1"} {
				c.apply(claimTemplateYAML("own-"+d, oneDevice("accel-gpu", fmt.Sprintf(`device.attributes["accel.nri.io"].deviceId == "%s"`, d), "")))
				c.apply(claimTemplateYAML("ext-"+d, oneDevice(extClass, fmt.Sprintf(`device.attributes["%s"].deviceId == "%s"`, extDriver, d), "")))
			}
			t.Logf("cluster %s and the example driver up in %.1f s", v, time.Since(start).Seconds())
			runScenarios(t, c, true,
				scenario{"a_each_driver_a_pod", scenarioJEachDriver},
				scenario{"b_one_device_two_drivers", func(t *testing.T, c *Cluster) { scenarioJOneDevice(t, c, x) }},
				scenario{"c_kill9_both_mid_prepare", func(t *testing.T, c *Cluster) { scenarioJKill9(t, c, x) }},
			)
		})
	}
}

// buildExampleDriver builds examples/go-dra-driver (go's build cache keeps it warm) into a temp
// dir and answers the binary.
func buildExampleDriver(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	must(t, err)
	out := filepath.Join(t.TempDir(), "go-dra-driver")
	begin := time.Now()
	cmd := exec.Command(goBin, "build", "-o", out, ".")
	cmd.Dir = filepath.Join(testsDir(), "..", "examples", "go-dra-driver")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build examples/go-dra-driver: %v\n%s", err, b)
	}
	t.Logf("examples/go-dra-driver built in %.1f s", time.Since(begin).Seconds())
	return out
}

// startExampleDriver runs the example driver on the host beside nri-accel: its kubelet plugin
// registration and DRA socket in the kubelet's dirs, nri-accel's claims socket, the admin's
// kubeconfig, both whole devices. It waits until the kubelet registered it and its slice is
// published.
func (c *Cluster) startExampleDriver(t *testing.T, bin string) *proc {
	t.Helper()
	x := startProc(t, "go-dra-driver", filepath.Join(c.Dir, "go-dra-driver.log"), nil, bin,
		"-driver-name="+extDriver, "-node-name="+nodeName, "-kubeconfig="+c.Admin,
		"-claims-socket="+filepath.Join(c.RunDir, "claims.sock"), "-devices=accel0,accel1",
		"-plugins-dir="+filepath.Join(c.KubeletDir, "plugins"),
		"-plugins-registry-dir="+filepath.Join(c.KubeletDir, "plugins_registry"), "-v=2")
	t.Cleanup(func() { x.Stop(5 * time.Second) })
	c.waitExampleDriver(t, x)
	return x
}

// waitExampleDriver waits until the kubelet registered the example driver (its log says so)
// and its ResourceSlice holds both devices.
func (c *Cluster) waitExampleDriver(t *testing.T, x *proc) {
	t.Helper()
	if !waitFor(90*time.Second, func() bool {
		if !x.Running() {
			return true
		}
		out, err := c.kubectlErr("get", "resourceslices", "--field-selector", "spec.driver="+extDriver+",spec.nodeName="+nodeName,
			"-o", "jsonpath={.items[*].spec.devices[*].name}")
		return err == nil && len(strings.Fields(out)) == 2 && c.exampleRegistered()
	}) || !x.Running() {
		t.Fatalf("the example driver did not come up (registration, slice):\n%s\nkubelet:\n%s", tail(x.Log, 40), tail(c.Kubelet.Log, 20))
	}
}

// exampleRegistered reports whether the kubelet registered the example driver since its last
// start: the driver logs the kubelet's answer after its last start line.
func (c *Cluster) exampleRegistered() bool {
	b, err := os.ReadFile(filepath.Join(c.Dir, "go-dra-driver.log"))
	if err != nil {
		return false
	}
	s := string(b)
	if i := strings.LastIndex(s, "===== cluster: go-dra-driver starting"); i >= 0 {
		s = s[i:]
	}
	return strings.Contains(s, "registered with the kubelet")
}

// claimUID answers the UID of the ResourceClaim behind pod's claim `gpu`.
func (c *Cluster) claimUID(t *testing.T, pod string) string {
	t.Helper()
	return str(c.claimOfPod(t, c.pod(pod)), "metadata", "uid")
}

// heldClaims answers nri-accel's claims (status) by UID, with the devices each holds.
func (c *Cluster) heldClaims(t *testing.T) map[string][]string {
	t.Helper()
	st, err := c.AccelStatus()
	must(t, err)
	out := map[string][]string{}
	for _, cl := range list(st, "claims") {
		var devs []string
		for _, r := range list(cl, "results") {
			devs = append(devs, str(r, "device_id"))
		}
		out[str(cl, "uid")] = devs
	}
	return out
}

// noDeviceHeldTwice fails the test when two of nri-accel's claims hold one device.
func (c *Cluster) noDeviceHeldTwice(t *testing.T) map[string][]string {
	t.Helper()
	held := c.heldClaims(t)
	by := map[string]string{}
	for uid, devs := range held {
		for _, d := range devs {
			if other, ok := by[d]; ok {
				t.Errorf("device %s is held by claims %s and %s", d, other, uid)
			}
			by[d] = uid
		}
	}
	return held
}

// Scenario j-a: a pod whose claim is nri-accel's own driver's and a pod whose claim is the
// example driver's run at once, each with its device node, and nri-accel holds both claims.
func scenarioJEachDriver(t *testing.T, c *Cluster) {
	c.apply(podYAML("j-own", "own-accel0") + "---\n" + podYAML("j-ext", "ext-accel1"))
	c.waitRunning(t, "j-own", 120*time.Second)
	p := c.waitRunning(t, "j-ext", 120*time.Second)
	want := extDriver + "/" + nodeName + "/whole-accel1"
	if got := allocatedDevices(c.claimOfPod(t, p)); len(got) != 1 || got[0] != want {
		t.Errorf("j-ext's claim allocated %v, want [%s]", got, want)
	}
	for pod, dev := range map[string]int{"j-own": 0, "j-ext": 1} {
		if _, err := c.ExecIn("default", pod, "app", "test", "-c", c.Devs.Path(dev)); err != nil {
			t.Errorf("the device node %s is not in %s: %v", c.Devs.Path(dev), pod, err)
		}
	}
	held := c.noDeviceHeldTwice(t)
	own, ext := c.claimUID(t, "j-own"), c.claimUID(t, "j-ext")
	if fmt.Sprint(held[own]) != "[accel0]" || fmt.Sprint(held[ext]) != "[accel1]" || len(held) != 2 {
		t.Errorf("nri-accel holds %v, want %s: [accel0] and %s: [accel1]", held, own, ext)
	}
	c.deletePod(t, "j-own")
	c.deletePod(t, "j-ext")
	c.waitNothingHeld(t)
}

// waitNothingHeld waits until nri-accel holds no claim and the CDI dir has no spec (the
// kubelet unprepares a deleted pod's claims).
func (c *Cluster) waitNothingHeld(t *testing.T) {
	t.Helper()
	if !waitFor(60*time.Second, func() bool { return len(c.heldClaims(t)) == 0 && len(c.specFiles()) == 0 }) {
		t.Fatalf("nri-accel still holds %v with specs %v", c.heldClaims(t), c.specFiles())
	}
}

// Scenario j-b: a pod through nri-accel's driver holds accel0; a pod through the example driver
// asks for accel0 too. The scheduler allocates it (the two drivers' pools do not know of each
// other), and nri-accel refuses its Prepare naming the holder, claim by claim, for as long as
// the first pod runs; the kubelet retries, and the pod runs once the first pod is gone.
func scenarioJOneDevice(t *testing.T, c *Cluster, x *proc) {
	c.apply(podYAML("j-first", "own-accel0"))
	c.waitRunning(t, "j-first", 120*time.Second)
	holder := c.claimUID(t, "j-first")
	c.apply(podYAML("j-second", "ext-accel0"))
	// The kubelet's event for the refused Prepare names the holder.
	var ev string
	if !waitFor(60*time.Second, func() bool {
		ev, _ = c.kubectlErr("get", "events", "-n", "default", "--field-selector", "involvedObject.name=j-second",
			"-o", "custom-columns=REASON:.reason,MSG:.message", "--no-headers")
		return strings.Contains(ev, "is held by claim "+holder)
	}) {
		t.Fatalf("no event of j-second names the holder %s:\n%s\ndriver:\n%s", holder, ev, tail(x.Log, 20))
	}
	t.Logf("j-second's event: %s", firstLineWith(ev, holder))
	if !fileHas(x.Log, `holder="`+holder) {
		t.Errorf("the example driver's log does not name the holder %s:\n%s", holder, tail(x.Log, 20))
	}
	// Refused while the holder runs: never both prepared.
	for i := 0; i < 3; i++ {
		if ph := str(c.pod("j-second"), "status", "phase"); ph != "Pending" {
			t.Fatalf("j-second is %s while j-first holds the device", ph)
		}
		if held := c.noDeviceHeldTwice(t); len(held) != 1 {
			t.Fatalf("nri-accel holds %v, want only %s", held, holder)
		}
		time.Sleep(time.Second)
	}
	c.deletePod(t, "j-first")
	begin := time.Now()
	c.waitRunning(t, "j-second", 120*time.Second)
	t.Logf("j-second Running %.1f s after j-first was gone (the kubelet's retry)", time.Since(begin).Seconds())
	if _, err := c.ExecIn("default", "j-second", "app", "test", "-c", c.Devs.Path(0)); err != nil {
		t.Errorf("the device node is not in j-second: %v", err)
	}
	held := c.noDeviceHeldTwice(t)
	if ext := c.claimUID(t, "j-second"); len(held) != 1 || fmt.Sprint(held[ext]) != "[accel0]" {
		t.Errorf("nri-accel holds %v, want %s: [accel0]", held, ext)
	}
	c.deletePod(t, "j-second")
	c.waitNothingHeld(t)
}

// countSinceStart counts the lines of log holding s since the process's last start.
func countSinceStart(log, name, s string) int {
	b, _ := os.ReadFile(log)
	text := string(b)
	if i := strings.LastIndex(text, "===== cluster: "+name+" starting"); i >= 0 {
		text = text[i:]
	}
	return strings.Count(text, s)
}

func firstLineWith(text, s string) string {
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, s) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}

// Scenario j-c: kill -9 while both drivers prepare. nri-accel is frozen (SIGSTOP) and a pod
// through each driver asking accel0 is created: the scheduler allocates both claims and the
// kubelet calls both drivers, whose prepares wait on nri-accel (its own driver's in its DRA
// socket, the example driver's Prepare in the claims socket: the driver logs that it
// forwarded). The example driver is killed (-9) with its Prepare in flight, nri-accel is let go
// (SIGCONT) and killed (-9) 0.3 s later, among the prepares it then serves (the dead driver's
// one included); both start again. Exactly one pod runs, the other is refused, one claim and
// one CDI spec; after both are gone nothing is held and no CDI spec is left, also after both
// processes start again.
func scenarioJKill9(t *testing.T, c *Cluster, x *proc) {
	forwarded0 := countSinceStart(x.Log, "go-dra-driver", "forwarding claims to nri-accel")
	granted0 := countSinceStart(c.Accel.Log, "nri-accel", "claim prepared")
	must(t, syscall.Kill(c.Accel.cmd.Process.Pid, syscall.SIGSTOP))
	frozen := true
	defer func() {
		if frozen {
			_ = syscall.Kill(c.Accel.cmd.Process.Pid, syscall.SIGCONT)
		}
	}()
	c.apply(podYAML("j-kill-own", "own-accel0") + "---\n" + podYAML("j-kill-ext", "ext-accel0"))
	pods := []string{"j-kill-own", "j-kill-ext"}
	if !waitFor(60*time.Second, func() bool {
		for _, name := range pods {
			allocated := false
			for _, s := range list(c.pod(name), "status", "resourceClaimStatuses") {
				out, err := c.kubectlErr("get", "resourceclaim", str(s, "resourceClaimName"), "-n", "default",
					"-o", "jsonpath={.status.allocation.devices.results[0].device}")
				allocated = allocated || err == nil && out != ""
			}
			if !allocated {
				return false
			}
		}
		return countSinceStart(x.Log, "go-dra-driver", "forwarding claims to nri-accel") > forwarded0
	}) {
		t.Fatalf("the claims were not allocated, or the example driver did not forward its prepare:\n%s\ndriver:\n%s",
			c.kubectl("describe", "pods", "-n", "default"), tail(x.Log, 20))
	}
	// The kubelet's call to nri-accel's own DRA socket is on its way by now too.
	time.Sleep(time.Second)
	x.Kill()
	must(t, syscall.Kill(c.Accel.cmd.Process.Pid, syscall.SIGCONT))
	frozen = false
	time.Sleep(300 * time.Millisecond)
	c.Accel.Kill()
	killed := time.Now()
	t.Logf("at the kills: nri-accel had granted %d prepares of this scenario",
		countSinceStart(c.Accel.Log, "nri-accel", "claim prepared")-granted0)
	c.Accel.start(t)
	c.waitAccelReady(t)
	x.start(t)
	c.waitExampleDriver(t, x)
	t.Logf("nri-accel and the example driver back %.1f s after the kills", time.Since(killed).Seconds())

	var first string
	if !waitFor(120*time.Second, func() bool {
		for _, name := range pods {
			if str(c.pod(name), "status", "phase") == "Running" {
				first = name
			}
		}
		return first != ""
	}) {
		t.Fatalf("neither pod runs after the kills:\n%s", c.kubectl("describe", "pods", "-n", "default"))
	}
	second := pods[0]
	if first == pods[0] {
		second = pods[1]
	}
	t.Logf("%s runs, %s waits", first, second)
	held := c.noDeviceHeldTwice(t)
	if uid := c.claimUID(t, first); len(held) != 1 || fmt.Sprint(held[uid]) != "[accel0]" {
		t.Errorf("nri-accel holds %v, want only %s's claim %s: [accel0]", held, first, uid)
	}
	if ph := str(c.pod(second), "status", "phase"); ph != "Pending" {
		t.Errorf("%s is %s while %s holds the device", second, ph, first)
	}
	if n := len(c.specFiles()); n != 1 {
		t.Errorf("%d CDI specs, want 1 (%s's):\n%s", n, first, c.specDump())
	}
	// That the refused pod runs once the holder is gone, b showed; here both go at once (CI time).
	c.kubectl("delete", "pod", first, second, "-n", "default", "--wait=false")
	if !waitFor(90*time.Second, func() bool { return c.pod(first) == nil && c.pod(second) == nil }) {
		t.Fatalf("%s and %s not gone within 90 s", first, second)
	}
	c.waitNothingHeld(t)

	// Nothing comes back from a restart either: no record, no spec, no adoption.
	c.Accel.Restart(t)
	c.waitAccelReady(t)
	x.Restart(t)
	c.waitExampleDriver(t, x)
	if held, specs := c.heldClaims(t), c.specFiles(); len(held) != 0 || len(specs) != 0 {
		t.Errorf("after restarting both, nri-accel holds %v with specs %v, want nothing", held, specs)
	}
}
