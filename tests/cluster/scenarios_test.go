package cluster

import (
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestUp brings one cluster up and keeps it until SIGINT or SIGTERM, for debugging by hand
// (tests/cluster.sh up). It skips unless NRI_ACCEL_CLUSTER_UP is set.
func TestUp(t *testing.T) {
	if os.Getenv("NRI_ACCEL_CLUSTER_UP") == "" {
		t.Skip("SKIPPED: TestUp keeps a cluster up for debugging; run it with sudo bash tests/cluster.sh up")
	}
	opts := Options{DevicePlugin: os.Getenv("NRI_ACCEL_CLUSTER_DEVICE_PLUGIN") != ""}
	if os.Getenv("NRI_ACCEL_CLUSTER_NODES") != "" {
		// A fleet with the chart installed on every node (fleet_test.go, o_fleet_test.go).
		opts = Options{Nodes: fleetNodes(t, 3), NoHostAccel: true}
	}
	c := Start(t, kubeVersions()[0], opts)
	if len(c.Nodes) > 1 {
		installFleet(t, c)
		for _, n := range c.Nodes {
			fmt.Printf("node %s: %s, nri-accel status --config %s\n", n.NodeName, n.Dir, n.AccelCfg)
		}
		fmt.Printf("the apiserver's audit log: %s\n", c.auditLog())
	}
	env := filepath.Join(c.Dir, "env.sh")
	must(t, os.WriteFile(env, []byte(fmt.Sprintf("export KUBECONFIG=%s\nexport PATH=%s:$PATH\nexport NRI_ACCEL_CONFIG=%s\n",
		c.Admin, c.KubeBin, c.AccelCfg)), 0o644))
	fmt.Printf("\ncluster %s up under %s\n  . %s   # kubectl and nri-accel status then talk to it\n  logs: %s/*.log\n"+
		"Ctrl-C (or kill -TERM %d) tears it down.\n", c.Version, c.Dir, env, c.Dir, os.Getpid())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	<-sig
}

// scenario is one subtest of a cluster test: its name and what it does on the cluster.
type scenario struct {
	name string
	f    func(t *testing.T, c *Cluster)
}

// runScenarios runs each as a subtest on c, in order, logging how long it took; c's failures go
// to the running subtest. With dependent, the rest are skipped once one fails (they build on
// what it left).
func runScenarios(t *testing.T, c *Cluster, dependent bool, scenarios ...scenario) {
	for _, s := range scenarios {
		ok := t.Run(s.name, func(t *testing.T) {
			c.t = t
			defer func() { c.t = t }()
			begin := time.Now()
			s.f(t, c)
			t.Logf("%s took %.1f s", s.name, time.Since(begin).Seconds())
		})
		c.t = t
		if !ok && dependent {
			break
		}
	}
}

// TestCluster runs the scenarios, in order, on one cluster per Kubernetes version.
func TestCluster(t *testing.T) {
	requireRoot(t)
	for _, v := range kubeVersions() {
		t.Run(v, func(t *testing.T) {
			start := time.Now()
			c := Start(t, v, Options{})
			t.Logf("cluster %s up in %.1f s (gates: %v)", v, time.Since(start).Seconds(), c.Gates)
			c.applyTemplate(t, "one-gpu", "accel-gpu")
			// The later scenarios build on the earlier ones.
			runScenarios(t, c, true,
				scenario{"a_slices_accepted", scenarioA},
				scenario{"b_claim_seen_inside", scenarioB},
				scenario{"c_one_device_two_pods", scenarioC},
				scenario{"d_release_then_pending_runs", scenarioD},
				scenario{"g_kill9_mid_prepare", scenarioGKill9},
				scenario{"g_apiserver_down_60s", scenarioGAPIServerDown},
				scenario{"g_kubelet_restart", scenarioGKubeletRestart},
				scenario{"g_kubelet_restart_new_pod", scenarioGKubeletRestartNewPod},
			)
		})
	}
}

// applyTemplate creates a ResourceClaimTemplate asking for one device of class, with an opaque
// configuration for nri-accel that sets NRI_ACCEL_CLUSTER=<name> in the containers using it
// (docs/dra.md, "Opaque configuration"): the CDI environment a container must see.
func (c *Cluster) applyTemplate(t *testing.T, name, class string) {
	t.Helper()
	c.apply(claimTemplateYAML(name, oneDevice(class, "", "NRI_ACCEL_CLUSTER: "+name)))
}

// oneDevice is a claim's `devices` asking one device of class as request `gpu`, narrowed by the
// CEL expression cel when set, with an opaque configuration for nri-accel setting env (a YAML
// mapping's body, `KEY: value`) when set. Indented for claimTemplateYAML; claimYAML shifts it.
func oneDevice(class, cel, env string) string {
	y := fmt.Sprintf("    devices:\n      requests:\n        - name: gpu\n          exactly:\n            deviceClassName: %s\n            count: 1\n", class)
	if cel != "" {
		y += fmt.Sprintf("            selectors:\n              - cel: {expression: '%s'}\n", cel)
	}
	if env != "" {
		y += "      config:\n        - opaque:\n            driver: accel.nri.io\n            parameters:\n" +
			"              apiVersion: accel.nri.io/v1alpha1\n              kind: DeviceConfig\n" +
			fmt.Sprintf("              env: {%s}\n", env)
	}
	return y
}

// claimTemplateYAML is a ResourceClaimTemplate in namespace default whose claims have devices.
func claimTemplateYAML(name, devices string) string {
	return fmt.Sprintf("apiVersion: resource.k8s.io/v1\nkind: ResourceClaimTemplate\nmetadata: {name: %s, namespace: default}\nspec:\n  spec:\n%s", name, devices)
}

// claimYAML is a ResourceClaim in namespace default with devices (as oneDevice indents them).
func claimYAML(name, devices string) string {
	return fmt.Sprintf("apiVersion: resource.k8s.io/v1\nkind: ResourceClaim\nmetadata: {name: %s, namespace: default}\nspec:\n%s",
		name, strings.ReplaceAll(strings.TrimSuffix(devices, "\n"), "\n  ", "\n")[2:]+"\n")
}

// podYAML is a host-network pod of the suite's image whose container `app` sleeps, holding a
// claim from template (none when empty). No service account token is mounted: the kubelet runs
// in a mount namespace of its own (see startKubelet), so volumes it mounts would not reach
// containerd.
func podYAML(name, template string) string {
	claims, uses := "", ""
	if template != "" {
		claims = fmt.Sprintf("  resourceClaims:\n    - {name: gpu, resourceClaimTemplateName: %s}\n", template)
		uses = "      resources: {claims: [{name: gpu}]}\n"
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: %s, namespace: default}
spec:
  hostNetwork: true
  automountServiceAccountToken: false
  enableServiceLinks: false
  terminationGracePeriodSeconds: 1
  tolerations: [{operator: Exists}]
%s  containers:
    - name: app
      image: %s
      imagePullPolicy: Never
      command: [sleep, "1000000"]
%s`, name, claims, imageRef, uses)
}

// obj is a Kubernetes object as kubectl prints it in JSON.
type obj = map[string]any

func (c *Cluster) getJSON(t *testing.T, args ...string) obj {
	t.Helper()
	out := c.kubectl(append(args, "-o", "json")...)
	var o obj
	if err := json.Unmarshal([]byte(out), &o); err != nil {
		t.Fatalf("kubectl %v: %v", args, err)
	}
	return o
}

// field walks o along keys (strings for maps, ints for lists).
func field(o any, keys ...any) any {
	for _, k := range keys {
		switch k := k.(type) {
		case string:
			m, _ := o.(map[string]any)
			o = m[k]
		case int:
			l, _ := o.([]any)
			if k >= len(l) {
				return nil
			}
			o = l[k]
		}
	}
	return o
}

func str(o any, keys ...any) string { s, _ := field(o, keys...).(string); return s }

func list(o any, keys ...any) []any { l, _ := field(o, keys...).([]any); return l }

// podPhase answers the pod's phase ("" when it does not exist).
func (c *Cluster) pod(name string) obj {
	out, err := c.kubectlErr("get", "pod", name, "-n", "default", "-o", "json")
	if err != nil {
		return nil
	}
	var o obj
	_ = json.Unmarshal([]byte(out), &o)
	return o
}

func (c *Cluster) waitRunning(t *testing.T, name string, within time.Duration) obj {
	t.Helper()
	var p obj
	if !waitFor(within, func() bool {
		p = c.pod(name)
		return str(p, "status", "phase") == "Running" && field(p, "status", "containerStatuses", 0, "ready") == true
	}) {
		out, _ := c.kubectlErr("describe", "pod", name, "-n", "default")
		t.Fatalf("pod %s not Running within %s:\n%s\nnri-accel:\n%s", name, within, out, tail(c.accelLog(), 20))
	}
	return p
}

// claimOfPod answers the ResourceClaim the pod's `gpu` claim became.
func (c *Cluster) claimOfPod(t *testing.T, p obj) obj {
	t.Helper()
	for _, s := range list(p, "status", "resourceClaimStatuses") {
		if str(s, "name") == "gpu" {
			return c.getJSON(t, "get", "resourceclaim", str(s, "resourceClaimName"), "-n", "default")
		}
	}
	t.Fatalf("pod %s has no claim status", str(p, "metadata", "name"))
	return nil
}

// allocatedDevices answers the devices the claim's allocation names, as driver/pool/device.
func allocatedDevices(claim obj) []string {
	var out []string
	for _, r := range list(claim, "status", "allocation", "devices", "results") {
		out = append(out, str(r, "driver")+"/"+str(r, "pool")+"/"+str(r, "device"))
	}
	return out
}

// accelClaims answers the claims nri-accel holds (status), by their claim name.
func (c *Cluster) accelClaims(t *testing.T) map[string]obj {
	t.Helper()
	st, err := c.AccelStatus()
	if err != nil {
		t.Fatalf("nri-accel status: %v", err)
	}
	out := map[string]obj{}
	for _, cl := range list(st, "claims") {
		m, _ := cl.(map[string]any)
		out[claimKey(m)] = m
	}
	return out
}

func claimKey(m obj) string {
	for _, k := range []string{"claim", "name", "id", "uid"} {
		if s, ok := m[k].(string); ok && s != "" {
			return s
		}
	}
	b, _ := json.Marshal(m)
	return string(b)
}

// Scenario a: every ResourceSlice nri-accel publishes is accepted by the real apiserver and
// reads back as nri-accel meant it; nothing is rewritten once published.
func scenarioA(t *testing.T, c *Cluster) {
	st, err := c.AccelStatus()
	must(t, err)
	k, _ := field(st, "kubernetes", "resource_slices").(map[string]any)
	// A 1.34 API server with DRAPartitionableDevices on wants counter sets beside the devices
	// that consume them (the layout before 1.35) and refuses nri-accel's own slices of counter
	// sets: nri-accel's probe sees that and withdraws the partitions (docs/dra.md, "Feature gates").
	partitions := c.minor() >= 35
	wantMissing := "[]"
	if !partitions {
		wantMissing = "[DRAPartitionableDevices]"
	}
	if gates := fmt.Sprint(list(k, "missing_gates")); gates != wantMissing {
		t.Errorf("nri-accel says the apiserver lacks gates %s, want %s (components run with %v)", gates, wantMissing, c.Gates)
	}
	if e := k["last_error"]; e != nil {
		t.Errorf("nri-accel's last publish error: %v", e)
	}
	slices := list(c.getJSON(t, "get", "resourceslices", "--field-selector", "spec.driver=accel.nri.io"), "items")
	wantSlices := map[string]float64{}
	for _, s := range list(k, "slices") {
		wantSlices[str(s, "name")] = field(s, "devices").(float64)
	}
	if len(slices) != len(wantSlices) || len(slices) == 0 {
		t.Fatalf("%d slices on the server, nri-accel says it published %v", len(slices), wantSlices)
	}
	devices := map[string]obj{}
	counters := map[string]bool{}
	for _, s := range slices {
		name := str(s, "metadata", "name")
		if str(s, "spec", "nodeName") != nodeName || str(s, "spec", "pool", "name") != nodeName {
			t.Errorf("slice %s: node %q pool %q, want %s", name, str(s, "spec", "nodeName"), str(s, "spec", "pool", "name"), nodeName)
		}
		if n := field(s, "spec", "pool", "resourceSliceCount"); n != float64(len(slices)) {
			t.Errorf("slice %s: resourceSliceCount %v, %d slices", name, n, len(slices))
		}
		if str(s, "metadata", "ownerReferences", 0, "kind") != "Node" {
			t.Errorf("slice %s is not owned by the Node: %v", name, field(s, "metadata", "ownerReferences"))
		}
		if got := len(list(s, "spec", "devices")); float64(got) != wantSlices[name] {
			t.Errorf("slice %s holds %d devices on the server, nri-accel published %v", name, got, wantSlices[name])
		}
		for _, d := range list(s, "spec", "devices") {
			devices[str(d, "name")] = d.(map[string]any)
		}
		for _, cs := range list(s, "spec", "sharedCounters") {
			counters[str(cs, "name")] = true
		}
	}
	names := make([]string, 0, len(devices))
	for n := range devices {
		names = append(names, n)
	}
	sort.Strings(names)
	t.Logf("devices on the server: %v; counter sets: %v", names, counters)
	want := []string{"shared-shared0", "sliced-sliced0", "sliced-sliced0-half-0", "sliced-sliced0-half-1", "whole-accel0"}
	if !partitions {
		want = []string{"shared-shared0", "sliced-sliced0", "whole-accel0"}
	}
	if strings.Join(names, ",") != strings.Join(want, ",") {
		t.Errorf("devices %v, want %v (partitions and shares need DRAPartitionableDevices and DRAConsumableCapacity)", names, want)
	}
	attr := func(d obj, name string) any {
		a, _ := field(d, "attributes", name).(map[string]any)
		for _, v := range a {
			return v
		}
		return nil
	}
	for _, n := range names {
		d := devices[n]
		if attr(d, "numaNode") != float64(0) {
			t.Errorf("device %s: numaNode %v, want 0", n, attr(d, "numaNode"))
		}
		if attr(d, "vendor") != "e2e" {
			t.Errorf("device %s: vendor %v, want e2e", n, attr(d, "vendor"))
		}
	}
	if d := devices["shared-shared0"]; d != nil && d["allowMultipleAllocations"] != true {
		t.Errorf("shared-shared0 lost allowMultipleAllocations on the server: %v", d)
	}
	if partitions {
		for _, p := range []string{"sliced-sliced0-half-0", "sliced-sliced0-half-1", "sliced-sliced0"} {
			if d := devices[p]; d != nil && len(list(d, "consumesCounters")) == 0 {
				t.Errorf("%s lost consumesCounters on the server: %v", p, d)
			}
		}
		if !counters["sliced-sliced0"] {
			t.Errorf("no counter set sliced-sliced0 on the server (have %v)", counters)
		}
	}
	if q := str(devices["whole-accel0"], "capacity", "memory", "value"); q != "16Gi" && q != "16384Mi" {
		t.Errorf("whole-accel0 memory capacity %q, want 16384Mi", q)
	}
	// Published once: the server's copy matches what nri-accel meant, so it rewrites nothing.
	versions := func() string {
		var v []string
		for _, s := range list(c.getJSON(t, "get", "resourceslices", "--field-selector", "spec.driver=accel.nri.io"), "items") {
			v = append(v, str(s, "metadata", "name")+"@"+str(s, "metadata", "resourceVersion"))
		}
		sort.Strings(v)
		return strings.Join(v, " ")
	}
	before, writes := versions(), field(k, "writes")
	time.Sleep(8 * time.Second)
	st, _ = c.AccelStatus()
	k, _ = field(st, "kubernetes", "resource_slices").(map[string]any)
	if after := versions(); after != before || field(k, "writes") != writes {
		t.Errorf("slices rewritten while nothing changed: %s -> %s, writes %v -> %v", before, after, writes, field(k, "writes"))
	}
	// The apiserver's validation accepts each slice again as read back (a server-side dry run).
	for _, s := range slices {
		m := s.(map[string]any)
		meta := m["metadata"].(map[string]any)
		clean := obj{"apiVersion": m["apiVersion"], "kind": m["kind"], "spec": m["spec"],
			"metadata": obj{"name": meta["name"].(string) + "-copy"}}
		b, _ := json.Marshal(clean)
		if out, err := c.kubectlIn(string(b), "create", "--dry-run=server", "-f", "-"); err != nil {
			t.Errorf("the apiserver refuses slice %s as read back: %v %s", meta["name"], err, out)
		}
	}
}

// Scenario b: a pod with a claim from the shipped DeviceClass accel-gpu is scheduled on
// nri-accel's slice, prepared by the kubelet through nri-accel, and inside its container the
// device node, the CDI environment and the NUMA-local CPU are there.
func scenarioB(t *testing.T, c *Cluster) {
	c.apply(podYAML("b-holder", "one-gpu"))
	start := time.Now()
	p := c.waitRunning(t, "b-holder", 120*time.Second)
	t.Logf("b-holder Running %.1f s after create", time.Since(start).Seconds())
	claim := c.claimOfPod(t, p)
	want := "accel.nri.io/" + nodeName + "/whole-accel0"
	if got := allocatedDevices(claim); len(got) != 1 || got[0] != want {
		t.Fatalf("claim allocated %v, want [%s]", got, want)
	}
	if rs := list(claim, "status", "reservedFor"); len(rs) != 1 || str(rs[0], "name") != "b-holder" {
		t.Errorf("claim reservedFor %v, want the pod", rs)
	}
	// nri-accel's status.devices entry (KEP-4817), whichever credentials it runs with.
	c.waitStatusEntry(t, str(claim, "metadata", "name"))
	// Inside the container.
	path := c.Devs.Path(0)
	out, err := c.ExecIn("default", "b-holder", "app", "stat", "-c", "%F|%t|%T|%a", path)
	if err != nil {
		t.Fatalf("the device node %s inside: %v", path, err)
	}
	f := strings.Split(strings.TrimSpace(out), "|")
	major, _ := strconv.ParseInt(f[1], 16, 64)
	if f[0] != "character special file" || major != int64(c.Devs.Major) || f[2] != "0" {
		t.Errorf("device node inside: %q, want a char device %d:0", out, c.Devs.Major)
	}
	open, _ := c.ExecIn("default", "b-holder", "app", "sh", "-c", "head -c1 "+path+" 2>&1 >/dev/null; true")
	if !strings.Contains(open, "No such device or address") {
		t.Errorf("opening the device inside says %q, want ENXIO (the device cgroup must let it through)", open)
	}
	if out, err := c.ExecIn("default", "b-holder", "app", "ls", c.Devs.Dir); err != nil || strings.TrimSpace(out) != "accel0" {
		t.Errorf("fake devices inside: %q %v, want only accel0", out, err)
	}
	envOut, err := c.ExecIn("default", "b-holder", "app", "env")
	must(t, err)
	specEnv := c.cdiEnv(t)
	for k, v := range specEnv {
		if !strings.Contains(envOut, k+"="+v+"\n") {
			t.Errorf("env %s=%s of the CDI spec is not inside:\n%s", k, v, envOut)
		}
	}
	cpus, err := c.ExecIn("default", "b-holder", "app", "grep", "Cpus_allowed_list", "/proc/self/status")
	must(t, err)
	if got := strings.Fields(cpus); len(got) != 2 || got[1] != c.LocalCPU {
		t.Errorf("cpuset inside %q, want the device's NUMA-local CPU %s", cpus, c.LocalCPU)
	}
	// The claim's opaque configuration (env NRI_ACCEL_CLUSTER) in the container: nri-accel puts
	// it in the CDI edits of the request's devices (once dropped; tests/README.md, "Bugs the
	// real cluster found").
	t.Run("opaque_config_env", func(t *testing.T) {
		if !strings.Contains(envOut, "NRI_ACCEL_CLUSTER=one-gpu\n") {
			t.Errorf("the claim's opaque DeviceConfig env NRI_ACCEL_CLUSTER=one-gpu is not inside:\n%s\nspecs:\n%s",
				envOut, c.specDump())
		}
	})
	// Release it for the next scenarios: the kubelet unprepares the claim.
	c.deletePod(t, "b-holder")
	if !waitFor(60*time.Second, func() bool { return len(c.accelClaims(t)) == 0 && len(c.specFiles()) == 0 }) {
		t.Fatalf("after b-holder went, nri-accel still holds %v, specs %v", c.accelClaims(t), c.specFiles())
	}
}

// cdiEnv answers the env of every CDI spec in nri-accel's CDI dir.
func (c *Cluster) cdiEnv(t *testing.T) map[string]string {
	env := map[string]string{}
	for _, f := range c.specFiles() {
		b, err := os.ReadFile(filepath.Join(c.CDIDir, f))
		must(t, err)
		var spec struct {
			ContainerEdits struct {
				Env []string `json:"env"`
			} `json:"containerEdits"`
			Devices []struct {
				ContainerEdits struct {
					Env []string `json:"env"`
				} `json:"containerEdits"`
			} `json:"devices"`
		}
		if err := json.Unmarshal(b, &spec); err != nil {
			// YAML: take the "- KEY=value" lines under env.
			inEnv := false
			for _, l := range strings.Split(string(b), "\n") {
				tl := strings.TrimSpace(l)
				switch {
				case strings.HasSuffix(tl, "env:"):
					inEnv = true
				case inEnv && strings.HasPrefix(tl, "- "):
					if k, v, ok := strings.Cut(strings.Trim(strings.TrimPrefix(tl, "- "), `"'`), "="); ok {
						env[k] = v
					}
				default:
					inEnv = false
				}
			}
			continue
		}
		all := spec.ContainerEdits.Env
		for _, d := range spec.Devices {
			all = append(all, d.ContainerEdits.Env...)
		}
		for _, kv := range all {
			if k, v, ok := strings.Cut(kv, "="); ok {
				env[k] = v
			}
		}
	}
	return env
}

func (c *Cluster) specFiles() []string {
	ents, _ := os.ReadDir(c.CDIDir)
	var out []string
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".yaml") || strings.HasSuffix(e.Name(), ".json") {
			out = append(out, e.Name())
		}
	}
	return out
}

func (c *Cluster) deletePod(t *testing.T, name string) {
	t.Helper()
	c.kubectl("delete", "pod", name, "-n", "default", "--wait=false")
	if !waitFor(90*time.Second, func() bool { return c.pod(name) == nil }) {
		t.Fatalf("pod %s not gone within 90 s", name)
	}
}

// Scenario c: two pods want the one exclusive device at once: one runs, the other stays Pending
// with the scheduler's reason, and no container of it is ever created (no CreateContainerError
// loop).
func scenarioC(t *testing.T, c *Cluster) {
	c.apply(podYAML("c-first", "one-gpu") + "---\n" + podYAML("c-second", "one-gpu"))
	var running, pending string
	if !waitFor(120*time.Second, func() bool {
		a, b := c.pod("c-first"), c.pod("c-second")
		ra, rb := str(a, "status", "phase") == "Running", str(b, "status", "phase") == "Running"
		switch {
		case ra && !rb:
			running, pending = "c-first", "c-second"
		case rb && !ra:
			running, pending = "c-second", "c-first"
		}
		return running != ""
	}) {
		t.Fatalf("neither pod runs:\n%s", c.kubectl("describe", "pods", "-n", "default"))
	}
	t.Logf("%s runs, %s waits", running, pending)
	// For 20 s: the other stays Pending, unscheduled, with the scheduler's reason.
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		p := c.pod(pending)
		if ph := str(p, "status", "phase"); ph != "Pending" {
			t.Fatalf("%s is %s, want Pending", pending, ph)
		}
		if n := str(p, "spec", "nodeName"); n != "" {
			t.Fatalf("%s was bound to %s although the device is held", pending, n)
		}
		if len(list(p, "status", "containerStatuses")) != 0 {
			t.Fatalf("%s has container statuses: %v", pending, field(p, "status", "containerStatuses"))
		}
		time.Sleep(2 * time.Second)
	}
	p := c.pod(pending)
	var reason, msg string
	for _, cond := range list(p, "status", "conditions") {
		if str(cond, "type") == "PodScheduled" {
			reason, msg = str(cond, "reason"), str(cond, "message")
		}
	}
	t.Logf("%s: PodScheduled %s: %s", pending, reason, msg)
	if reason != "Unschedulable" || !strings.Contains(msg, "claim") {
		t.Errorf("%s's PodScheduled condition: %s %q, want Unschedulable naming the claims", pending, reason, msg)
	}
	ev := c.kubectl("get", "events", "-n", "default", "--field-selector", "involvedObject.name="+pending, "-o", "custom-columns=REASON:.reason,MSG:.message", "--no-headers")
	if strings.Contains(ev, "Failed\t") || strings.Contains(ev, "CreateContainerError") || !strings.Contains(ev, "FailedScheduling") {
		t.Errorf("%s's events: want FailedScheduling only:\n%s", pending, ev)
	}
	if n := len(c.accelClaims(t)); n != 1 {
		t.Errorf("nri-accel holds %d claims, want 1 (the running pod's)", n)
	}
	c.running, c.pending = running, pending
}

// Scenario d: the running pod deleted: the kubelet unprepares its claim through nri-accel (its
// record and CDI spec go, the device is free), and the Pending pod is scheduled and runs with
// the device.
func scenarioD(t *testing.T, c *Cluster) {
	if c.running == "" {
		t.Fatal("scenario c did not leave a running and a pending pod")
	}
	held := c.accelClaims(t)
	specs := c.specFiles()
	if len(held) != 1 || len(specs) == 0 {
		t.Fatalf("before: nri-accel holds %v with specs %v, want one claim with its spec", held, specs)
	}
	c.deletePod(t, c.running)
	start := time.Now()
	p := c.waitRunning(t, c.pending, 120*time.Second)
	t.Logf("%s Running %.1f s after %s was gone", c.pending, time.Since(start).Seconds(), c.running)
	for k := range held {
		if _, still := c.accelClaims(t)[k]; still {
			t.Errorf("nri-accel still holds the deleted pod's claim %s", k)
		}
	}
	for _, s := range specs {
		if _, err := os.Stat(filepath.Join(c.CDIDir, s)); err == nil {
			t.Errorf("the deleted pod's CDI spec %s is still there", s)
		}
	}
	if !fileHas(c.Kubelet.Log, "NodeUnprepareResources") && !fileHas(c.accelLog(), "unprepare") {
		t.Logf("neither log names the unprepare (kubelet at -v=2 may not)")
	}
	want := "accel.nri.io/" + nodeName + "/whole-accel0"
	if got := allocatedDevices(c.claimOfPod(t, p)); len(got) != 1 || got[0] != want {
		t.Errorf("%s's claim allocated %v, want [%s]", c.pending, got, want)
	}
	if _, err := c.ExecIn("default", c.pending, "app", "test", "-c", c.Devs.Path(0)); err != nil {
		t.Errorf("the device node is not in %s: %v", c.pending, err)
	}
	c.deletePod(t, c.pending)
}

func fileHas(path, s string) bool {
	b, _ := os.ReadFile(path)
	return strings.Contains(string(b), s)
}

// specDump answers the CDI specs' text, for a failure message.
func (c *Cluster) specDump() string {
	var b strings.Builder
	for _, f := range c.specFiles() {
		body, _ := os.ReadFile(filepath.Join(c.CDIDir, f))
		fmt.Fprintf(&b, "--- %s\n%s\n", f, body)
	}
	return b.String()
}
