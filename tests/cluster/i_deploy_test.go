package cluster

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// Scenario i, nri-accel deployed as users deploy it: the image packaging/image.sh builds,
// imported into the node's containerd, run by the kubelet from packaging/kubernetes applied as
// shipped (manifests_as_shipped) and from the Helm chart as a real release
// (helm_upgrade_rollback_uninstall). No nri-accel runs on the host. tests/README.md, "The
// cluster suite", says what each proves.
func TestClusterDeploy(t *testing.T) {
	requireRoot(t)
	for _, v := range kubeVersions() {
		t.Run(v, func(t *testing.T) {
			start := time.Now()
			from := ranCount()
			c := Start(t, v, Options{NoHostAccel: true})
			t.Logf("cluster %s up in %.1f s", v, time.Since(start).Seconds())
			d := &deployment{c: c, image: c.importImage(t), inventory: c.makeInventory(t)}
			c.writeHostViewConfig(t, d.inventory)
			c.applyTemplate(t, "one-gpu", "accel-gpu")
			// The Helm release wants the plain manifests' objects gone.
			runScenarios(t, c, true,
				scenario{"manifests_as_shipped", func(t *testing.T, _ *Cluster) { scenarioIManifests(t, d) }},
				scenario{"device_plugin_manifest_as_shipped", func(t *testing.T, _ *Cluster) { scenarioIDevicePlugin(t, d) }},
				scenario{"helm_upgrade_rollback_uninstall", func(t *testing.T, _ *Cluster) { scenarioIHelm(t, d) }},
			)
			// docs/kubernetes.md gives only commands this scenario ran (issue 29 item 4).
			if !t.Failed() {
				if missing := uncovered(kubernetesPage(t), ranSince(from)); len(missing) != 0 {
					t.Errorf("docs/kubernetes.md gives commands scenario i did not run (run them here, or take them out of the page):\n  %s",
						strings.Join(missing, "\n  "))
				}
			}
		})
	}
}

// deployment is what the scenario's steps share.
type deployment struct {
	c         *Cluster
	image     string // nri-accel:<version>
	inventory string // the config's discovery and pools sections for the node's fake devices
}

// importImage builds the image with packaging/image.sh from the binary under test, imports it
// into the node's containerd and answers the name a pod gives it (nri-accel:<version>).
func (c *Cluster) importImage(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(c.Dir, "image")
	begin := time.Now()
	out, err := exec.Command("bash", filepath.Join(testsDir(), "..", "packaging", "image.sh"), accelBin(t), dir).CombinedOutput()
	if err != nil {
		t.Fatalf("packaging/image.sh: %v\n%s", err, out)
	}
	t.Logf("packaging/image.sh (%.1f s): %s", time.Since(begin).Seconds(), strings.TrimSpace(string(out)))
	archives, _ := filepath.Glob(filepath.Join(dir, "nri-accel-*-oci.tar"))
	if len(archives) != 1 {
		t.Fatalf("packaging/image.sh wrote no single archive in %s: %v", dir, archives)
	}
	version := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(archives[0]), "nri-accel-"), "-oci.tar")
	ctr := filepath.Join(buildPeer(t, containerdPeer), "ctr")
	if out, err := exec.Command(ctr, "--address", c.CRISocket, "-n", "k8s.io", "images", "import", archives[0]).CombinedOutput(); err != nil {
		t.Fatalf("ctr images import %s: %v\n%s", archives[0], err, out)
	}
	return "nri-accel:" + version
}

// writeHostViewConfig writes the config `nri-accel status` and `reconcile` read on the machine
// for the daemon in the pod: the node's paths as the machine sees them.
func (c *Cluster) writeHostViewConfig(t *testing.T, inventory string) {
	t.Helper()
	must(t, os.MkdirAll(c.AccelDir, 0o755))
	c.AccelCfg = filepath.Join(c.AccelDir, "config.yaml")
	must(t, os.WriteFile(c.AccelCfg, []byte(fmt.Sprintf("state_dir: %s\nnri:\n  socket: %s\nclaims_api:\n  socket: %s\ncdi:\n  dir: %s\n%s",
		c.StateDir, c.nriSocket(), filepath.Join(c.RunDir, "claims.sock"), c.CDIDir, inventory)), 0o644))
}

// setInventory replaces, in the config.yaml of ConfigMap ns/name, the sections from `first` up to
// `next` with the node's inventory (its discovery and pools sections): the operator's step the
// shipped manifests ask for, since their config discovers devices in sysfs.
func (d *deployment) setInventory(t *testing.T, ns, name, first, next string) {
	t.Helper()
	c := d.c
	cfg := str(c.getJSON(t, "get", "configmap", name, "-n", ns), "data", "config.yaml")
	re := regexp.MustCompile(`(?s)\n` + first + `:\n.*?\n` + next + `:\n`)
	if !re.MatchString(cfg) {
		t.Fatalf("the shipped config of %s/%s has no %s section before %s:\n%s", ns, name, first, next, cfg)
	}
	cfg = re.ReplaceAllLiteralString(cfg, "\n"+d.inventory+next+":\n")
	patch, _ := json.Marshal(obj{"data": obj{"config.yaml": cfg}})
	c.kubectl("patch", "configmap", name, "-n", ns, "--type", "merge", "-p", string(patch))
}

// accelPods answers the DaemonSet's pods (namespace nri-accel).
func (c *Cluster) accelPods(t *testing.T) []obj {
	t.Helper()
	var out []obj
	for _, p := range list(c.getJSON(t, "get", "pods", "-n", "nri-accel", "-l", "app.kubernetes.io/name=nri-accel"), "items") {
		out = append(out, p.(map[string]any))
	}
	return out
}

// waitDeployed waits until the DaemonSet's one pod is ready and not `notUID`, and the daemon in
// it has its gate open, its DRA driver registered by the kubelet and its slices published (with
// devices when wantDevices). It answers that pod.
func (c *Cluster) waitDeployed(t *testing.T, notUID string, wantDevices bool) obj {
	t.Helper()
	var pod obj
	var st map[string]any
	if !waitFor(180*time.Second, func() bool {
		pods := c.accelPods(t)
		if len(pods) != 1 || str(pods[0], "metadata", "uid") == notUID || str(pods[0], "metadata", "deletionTimestamp") != "" ||
			field(pods[0], "status", "containerStatuses", 0, "ready") != true {
			return false
		}
		pod = pods[0]
		var err error
		if st, err = c.AccelStatus(); err != nil {
			return false
		}
		open, _ := field(st, "gate", "open").(bool)
		devices := 0.0
		for _, s := range list(st, "kubernetes", "resource_slices", "slices") {
			n, _ := field(s, "devices").(float64)
			devices += n
		}
		return open && str(st, "kubernetes", "resource_slices", "state") == "published" &&
			str(st, "kubelet", "dra", "registration") == "registered" && (!wantDevices || devices > 0)
	}) {
		out, _ := c.kubectlErr("describe", "pods", "-n", "nri-accel")
		t.Fatalf("nri-accel's DaemonSet pod did not come up (ready, gate open, registered, slices published); status %v\n%s\nlog:\n%s\nkubelet:\n%s",
			st, out, tail(c.accelLog(), 30), tail(c.Kubelet.Log, 20))
	}
	return pod
}

// accelLog is the path of nri-accel's log: the host binary's, else the newest container log of
// the DaemonSet's pods (the kubelet writes it under the cluster's pod-logs dir).
func (c *Cluster) accelLog() string {
	if c.Accel != nil {
		return c.Accel.Log
	}
	logs, _ := filepath.Glob(filepath.Join(c.Dir, "pod-logs", "nri-accel_*", "nri-accel", "*.log"))
	newest, when := "", time.Time{}
	for _, l := range logs {
		if fi, err := os.Stat(l); err == nil && fi.ModTime().After(when) {
			newest, when = l, fi.ModTime()
		}
	}
	return newest
}

// Scenario i, plain manifests: rbac.yaml, deviceclasses.yaml and daemonset.yaml applied as
// shipped, the image set with `kubectl set image`. The pod runs from its ConfigMap and service
// account token (volumes the kubelet mounts), nri-accel in it connects to NRI, is registered by
// the kubelet and publishes its slices. Then the operator's step the manifest asks for: the
// ConfigMap's pools set to the node's devices (the shipped config discovers devices in sysfs,
// and this machine has none), the DaemonSet restarted, and a pod with a claim gets its device
// (scenario b, against the daemon in the pod). Everything deleted as docs/kubernetes.md says.
func scenarioIManifests(t *testing.T, d *deployment) {
	c := d.c
	pkg := filepath.Join(testsDir(), "..", "packaging", "kubernetes")
	// The shipped DaemonSet runs only on the nodes an operator labels (docs/kubernetes.md).
	c.kubectl("label", "node", nodeName, "accel.nri.io/enabled=true")
	defer c.kubectl("label", "node", nodeName, "accel.nri.io/enabled-")
	for _, f := range []string{"rbac.yaml", "deviceclasses.yaml", "daemonset.yaml"} {
		if out, err := c.kubectlErr("apply", "-f", filepath.Join(pkg, f)); err != nil {
			t.Fatalf("kubectl apply -f packaging/kubernetes/%s: %v\n%s", f, err, out)
		}
	}
	c.kubectl("set", "image", "-n", "nri-accel", "daemonset/nri-accel", "nri-accel="+d.image)
	begin := time.Now()
	pod := c.waitDeployed(t, "", false)
	t.Logf("the shipped DaemonSet's pod %s is ready and nri-accel in it registered and published %.1f s after apply (image %s)",
		str(pod, "metadata", "name"), time.Since(begin).Seconds(), str(pod, "spec", "containers", 0, "image"))
	st, err := c.AccelStatus()
	must(t, err)
	t.Logf("with the shipped config (sysfs discovery, no accelerators on this machine): slices %v", field(st, "kubernetes", "resource_slices", "slices"))

	// The operator's pools: the config's discovery and pools replaced, nothing else.
	d.setInventory(t, "nri-accel", "nri-accel", "pools", "dra")
	c.kubectl("rollout", "restart", "-n", "nri-accel", "daemonset/nri-accel")
	c.waitDeployed(t, str(pod, "metadata", "uid"), true)

	scenarioB(t, c)
	d.walkVerify(t)

	// Uninstall, as docs/kubernetes.md says.
	c.kubectl("delete", "-f", filepath.Join(pkg, "daemonset.yaml"), "--wait=true", "--timeout=120s")
	c.kubectl("delete", "resourceslices", "--field-selector", "spec.driver=accel.nri.io")
	c.kubectl("delete", "-f", filepath.Join(pkg, "deviceclasses.yaml"), "-f", filepath.Join(pkg, "rbac.yaml"), "--wait=true", "--timeout=120s")
	if pods := c.accelPods(t); len(pods) != 0 {
		t.Errorf("nri-accel pods left after the delete: %d", len(pods))
	}
	if specs := c.specFiles(); len(specs) != 0 {
		t.Errorf("CDI specs left after the delete: %v", specs)
	}
}

// Scenario i, the device plugin's manifest: packaging/kubernetes/nri-accel-device-plugin.yaml
// applied as shipped, the image set, the pools set to the node's devices and the node labelled,
// as the manifest's comment asks. The kubelet registers the extended resources from the daemon in
// the DaemonSet's pod, and a pod asking for accel.nri.io/whole runs with the device node and its
// NUMA-local CPU. Then the pod and the manifest deleted: no CDI spec and no pod left.
func scenarioIDevicePlugin(t *testing.T, d *deployment) {
	c := d.c
	const ns, ds = "kube-system", "nri-accel-device-plugin"
	manifest := filepath.Join(testsDir(), "..", "packaging", "kubernetes", ds+".yaml")
	if out, err := c.kubectlErr("apply", "-f", manifest); err != nil {
		t.Fatalf("kubectl apply -f packaging/kubernetes/%s.yaml: %v\n%s", ds, err, out)
	}
	c.kubectl("set", "image", "-n", ns, "daemonset/"+ds, "nri-accel="+d.image)
	// The operator's pools before the label, so the first pod starts with them.
	d.setInventory(t, ns, ds, "discovery", "device_plugin")
	begin := time.Now()
	c.kubectl("label", "node", nodeName, "accel.nri.io/device-plugin=true")
	pods := func() []any {
		return list(c.getJSON(t, "get", "pods", "-n", ns, "-l", "app.kubernetes.io/instance="+ds), "items")
	}
	if !waitFor(180*time.Second, func() bool { return c.allocatable("accel.nri.io/whole") == 1 }) {
		out, _ := c.kubectlErr("describe", "pods", "-n", ns, "-l", "app.kubernetes.io/instance="+ds)
		t.Fatalf("the kubelet did not register accel.nri.io/whole from the device plugin DaemonSet's pod:\n%s\nkubelet:\n%s",
			out, tail(c.Kubelet.Log, 20))
	}
	t.Logf("accel.nri.io/whole allocatable %.1f s after the node was labelled (pods %d, image %s)",
		time.Since(begin).Seconds(), len(pods()), d.image)
	c.checkAllocatable(t)
	c.runWholeDevicePod(t, "i-dp")
	c.deletePod(t, "i-dp")
	// The claim goes with the container's removal, which the kubelet does soon after the delete.
	if !waitFor(90*time.Second, func() bool { return len(c.specFiles()) == 0 }) {
		t.Errorf("CDI specs left 90 s after i-dp was deleted: %v", c.specFiles())
	}

	c.kubectl("delete", "-f", manifest, "--wait=true", "--timeout=120s")
	c.kubectl("label", "node", nodeName, "accel.nri.io/device-plugin-")
	if !waitFor(60*time.Second, func() bool { return len(pods()) == 0 }) {
		t.Errorf("device plugin pods left after the delete: %d", len(pods()))
	}
}

// Scenario i, Helm: the chart installed as a real release (the image's tag, the node's devices as
// values), a pod holding a claim, then `helm upgrade` with a changed value that rolls the
// DaemonSet's pod and `helm rollback` to the first revision: throughout, the held claim's CDI
// spec never leaves (checked every 50 ms), the pod keeps its container and device, and each new
// nri-accel holds the claim again from its checkpoint. Then the pod deleted (the kubelet
// unprepares it through the deployed nri-accel) and `helm uninstall`: no CDI spec and no claim
// record left.
func scenarioIHelm(t *testing.T, d *deployment) {
	c := d.c
	values := filepath.Join(c.Dir, "helm-values.yaml")
	must(t, os.WriteFile(values, []byte(d.inventory), 0o644))
	version := strings.TrimPrefix(d.image, "nri-accel:")
	const ns, release = "nri-accel", "nri-accel"
	helm := func(args ...string) string {
		t.Helper()
		begin := time.Now()
		out, err := c.helm(t, append(args, "--namespace", ns)...)
		if err != nil {
			t.Fatalf("%v\nnri-accel:\n%s", err, tail(c.accelLog(), 20))
		}
		t.Logf("helm %s: %.1f s", args[0], time.Since(begin).Seconds())
		return out
	}
	c.kubectl("label", "node", nodeName, "accel.nri.io/enabled=true")
	defer c.kubectl("label", "node", nodeName, "accel.nri.io/enabled-")
	helm("install", release, chartDir(), "--create-namespace", "--set", "image.tag="+version, "-f", values, "--wait", "--timeout", "3m")
	pod := c.waitDeployed(t, "", true)

	c.apply(podYAML("i-holder", "one-gpu"))
	holder := c.waitRunning(t, "i-holder", 120*time.Second)
	claim := c.claimOfPod(t, holder)
	uid := str(claim, "metadata", "uid")
	container := str(holder, "status", "containerStatuses", 0, "containerID")
	specs := c.specFiles()
	if len(specs) != 1 || len(c.accelClaims(t)) != 1 {
		t.Fatalf("with i-holder running: specs %v, nri-accel holds %v; want one of each", specs, c.accelClaims(t))
	}
	spec := filepath.Join(c.CDIDir, specs[0])
	body, err := os.ReadFile(spec)
	must(t, err)

	// The spec must stay for as long as the pod runs: watched while the pods roll.
	var mu sync.Mutex
	var gone []string
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			if b, err := os.ReadFile(spec); err != nil || string(b) != string(body) {
				mu.Lock()
				gone = append(gone, time.Now().Format("15:04:05.000"))
				mu.Unlock()
			}
		}
	}()
	stillHeld := func(step string) {
		t.Helper()
		p := c.pod("i-holder")
		if str(p, "status", "phase") != "Running" || str(p, "status", "containerStatuses", 0, "containerID") != container ||
			field(p, "status", "containerStatuses", 0, "restartCount") != float64(0) {
			t.Errorf("after %s i-holder is %s with container %s (restarts %v), want Running in %s",
				step, str(p, "status", "phase"), str(p, "status", "containerStatuses", 0, "containerID"),
				field(p, "status", "containerStatuses", 0, "restartCount"), container)
		}
		if _, err := c.ExecIn("default", "i-holder", "app", "test", "-c", c.Devs.Path(0)); err != nil {
			t.Errorf("after %s the device node is not in i-holder: %v", step, err)
		}
		held := c.accelClaims(t)
		b, _ := json.Marshal(held)
		if len(held) != 1 || !strings.Contains(string(b), uid) {
			t.Errorf("after %s the new nri-accel holds %s, want claim %s (from its checkpoint)", step, b, uid)
		}
	}

	helm("upgrade", release, chartDir(), "--reuse-values", "--set-string", "podAnnotations.rollout=upgrade", "--wait", "--timeout", "3m")
	upgraded := c.waitDeployed(t, str(pod, "metadata", "uid"), true)
	if str(upgraded, "metadata", "annotations", "rollout") != "upgrade" {
		t.Errorf("the pod after helm upgrade lacks the changed value: %v", field(upgraded, "metadata", "annotations"))
	}
	stillHeld("helm upgrade")

	helm("rollback", release, "1", "--wait", "--timeout", "3m")
	rolledBack := c.waitDeployed(t, str(upgraded, "metadata", "uid"), true)
	if _, has := field(rolledBack, "metadata", "annotations").(map[string]any)["rollout"]; has {
		t.Errorf("the pod after helm rollback still has the upgrade's value: %v", field(rolledBack, "metadata", "annotations"))
	}
	stillHeld("helm rollback")
	close(stop)
	<-done
	if len(gone) > 0 {
		t.Errorf("claim %s's CDI spec %s was missing or changed at %d checks (%v) while i-holder ran", uid, specs[0], len(gone), gone)
	}
	if fileHas(c.Kubelet.Log, "NodeUnprepareResources") {
		t.Logf("the kubelet log names NodeUnprepareResources before i-holder was deleted: %s", grepFile(c.Kubelet.Log, "NodeUnprepareResources"))
	}
	t.Logf("helm history:\n%s", helm("history", release))

	c.deletePod(t, "i-holder")
	if !waitFor(60*time.Second, func() bool { return len(c.accelClaims(t)) == 0 && len(c.specFiles()) == 0 }) {
		t.Fatalf("after i-holder went nri-accel still holds %v, specs %v", keys(c.accelClaims(t)), c.specFiles())
	}
	helm("uninstall", release, "--wait", "--timeout", "2m")
	if !waitFor(60*time.Second, func() bool { return len(c.accelPods(t)) == 0 }) {
		t.Fatalf("nri-accel's pods still there after helm uninstall")
	}
	if specs := c.specFiles(); len(specs) != 0 {
		t.Errorf("CDI specs left after helm uninstall: %v", specs)
	}
	// A stopping daemon leaves its slices published on purpose; the operator deletes them
	// (docs/kubernetes.md, "Uninstall").
	slices := func() int {
		return len(list(c.getJSON(t, "get", "resourceslices", "--field-selector", "spec.driver=accel.nri.io"), "items"))
	}
	if n := slices(); n == 0 {
		t.Errorf("no ResourceSlice left after helm uninstall: docs/kubernetes.md says a stopping nri-accel leaves them")
	}
	c.kubectl("delete", "resourceslices", "--field-selector", "spec.driver=accel.nri.io")
	if n := slices(); n != 0 {
		t.Errorf("%d ResourceSlices after deleting them", n)
	}
	out, err := exec.Command(accelBin(t), "reconcile", "--dry-run", "--config", c.AccelCfg).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "prepared (record + spec): 0\n") ||
		strings.Contains(string(out), "would ") || strings.Contains(string(out), "UNPROVEN") {
		t.Errorf("the state left after helm uninstall is not empty (nri-accel reconcile --dry-run): %v\n%s", err, out)
	}
	t.Logf("left on the node after helm uninstall: %s; reconcile --dry-run:\n%s", treeOf(c.StateDir), out)

	// A labelled node whose runtime has no NRI socket (issue 37): the pod does not hang in
	// ContainerCreating on the host path; it starts, fails and its status says why.
	noNRI := filepath.Join(c.Dir, "no-nri")
	helm("install", release, chartDir(), "--set", "image.tag="+version, "-f", values,
		"--set", "host.nriSocketDir="+noNRI)
	var message string
	if !waitFor(120*time.Second, func() bool {
		for _, p := range c.accelPods(t) {
			for _, at := range []string{"lastState", "state"} {
				if m, ok := field(p, "status", "containerStatuses", 0, at, "terminated", "message").(string); ok && m != "" {
					message = m
				}
			}
		}
		return strings.Contains(message, "does not exist: enable NRI")
	}) {
		out, _ := c.kubectlErr("describe", "pods", "-n", ns)
		t.Errorf("no pod status saying the NRI socket is missing within 120 s (last message %q):\n%s", message, out)
	} else {
		t.Logf("without an NRI socket the pod's status says: %s", lastLine(message))
	}
	helm("uninstall", release, "--wait", "--timeout", "2m")
}

// lastLine answers the last non-empty line of s.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

func keys(m map[string]obj) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// grepFile answers the lines of path holding s.
func grepFile(path, s string) string {
	b, _ := os.ReadFile(path)
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// treeOf lists the files under dir, relative to it.
func treeOf(dir string) []string {
	var out []string
	_ = filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			rel, _ := filepath.Rel(dir, p)
			out = append(out, rel)
		}
		return nil
	})
	return out
}
