package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"nri-accel/tests/internal/ociimage"
)

// startContainerd runs the node's containerd (config version 3) with NRI and CDI on, the OOM
// score restriction this sandbox needs, the suite's image as the sandbox image and a CNI config
// that is never run (pods use the host network) but lets containerd report the network ready.
func (c *Cluster) startContainerd(t *testing.T, bin string) {
	t.Helper()
	d := filepath.Join(c.Dir, "containerd")
	cni, cniBin := filepath.Join(d, "cni"), filepath.Join(d, "cni-bin")
	c.startPodNet(t, cniBin, cni)
	c.CRISocket = filepath.Join(d, "containerd.sock")
	cfg := fmt.Sprintf(`version = 3
root = %q
state = %q
[grpc]
  address = %q
[ttrpc]
  address = %q
[plugins.'io.containerd.internal.v1.opt']
  path = %q
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = %q
[plugins.'io.containerd.cri.v1.runtime']
  enable_cdi = true
  cdi_spec_dirs = [%q]
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    conf_dir = %q
    bin_dirs = [%q]
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        Root = %q
[plugins.'io.containerd.nri.v1.nri']
  disable = false
  socket_path = %q
  plugin_registration_timeout = "5s"
  plugin_request_timeout = "2s"
`, filepath.Join(d, "root"), filepath.Join(d, "state"), c.CRISocket, c.CRISocket+".ttrpc", filepath.Join(d, "opt"),
		imageRef, c.CDIDir, cni, cniBin, filepath.Join(d, "runc"), c.nriSocket())
	config := filepath.Join(c.Dir, "containerd.toml")
	must(t, os.WriteFile(config, []byte(cfg), 0o644))
	c.Containerd = startProc(t, "containerd", filepath.Join(c.Dir, "containerd.log"), []string{"PATH=" + bin + ":" + os.Getenv("PATH")},
		c.inNode(filepath.Join(bin, "containerd"), "--config", config)...)
	if !waitFor(60*time.Second, func() bool { return criReady(c.CRISocket) == nil || !c.Containerd.Running() }) || !c.Containerd.Running() {
		t.Fatalf("containerd did not come up:\n%s", tail(c.Containerd.Log, 30))
	}
	archive := ociimage.Archive(t, d)
	if out, err := exec.Command(filepath.Join(bin, "ctr"), "--address", c.CRISocket, "-n", "k8s.io", "images", "import", archive).CombinedOutput(); err != nil {
		t.Fatalf("ctr images import: %v\n%s", err, out)
	}
}

// nriSocket is containerd's NRI socket as the machine sees it (/var/run/nri/nri.sock in the node's
// mount namespace).
func (c *Cluster) nriSocket() string { return filepath.Join(c.Dir, "nri", "nri.sock") }

// The kernel settings the kubelet insists on (it writes them when they differ, or with
// protectKernelDefaults refuses to start). In the node's mount namespace (nodens_test.go) these
// files are bound over by files holding the values it wants, so the shared host's settings are
// left alone.
var kubeletSysctls = map[string]string{
	"vm/overcommit_memory":      "1",
	"vm/panic_on_oom":           "0",
	"kernel/panic":              "10",
	"kernel/panic_on_oops":      "1",
	"kernel/keys/root_maxkeys":  "1000000",
	"kernel/keys/root_maxbytes": "25000000",
}

// devicePluginPath is the device plugin API's fixed dir of the kubelet's socket.
const devicePluginPath = "/var/lib/kubelet/device-plugins"

// startKubelet runs the kubelet on the node's containerd with the settings this sandbox needs
// (tests/README.md, "The cluster suite"), and waits until the Node is Ready.
func (c *Cluster) startKubelet(t *testing.T) {
	t.Helper()
	kubeconfig := c.pki.kubeconfig(t, "kubelet", c.Server, "system:node:"+c.node(), "system:nodes")
	// The apiserver reaches the kubelet (exec, logs) at the Node's InternalIP, which the kubelet
	// takes from the machine's interfaces: every non-loopback address is in its certificate. A
	// fleet's node has its own address in its own network namespace (fleet_test.go).
	hosts := []string{"127.0.0.1", c.node()}
	var nodeIP []string
	if c.NodeIP != "" {
		hosts = append(hosts, c.NodeIP)
		nodeIP = []string{"--node-ip=" + c.NodeIP}
	} else if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if ip, ok := a.(*net.IPNet); ok && !ip.IP.IsLoopback() {
				hosts = append(hosts, ip.IP.String())
			}
		}
	}
	srvCert, srvKey := c.pki.issue(t, "kubelet-server", "system:node:"+c.node(), []string{"system:nodes"}, hosts...)
	gates := c.gatesFor(t, "kubelet")
	var gateYAML strings.Builder
	for _, g := range strings.Split(gates, ",") {
		if k, v, ok := strings.Cut(g, "="); ok {
			fmt.Fprintf(&gateYAML, "\n  %s: %s", k, v)
		}
	}
	if gateYAML.Len() == 0 {
		gateYAML.WriteString(" {}")
	}
	// All addresses: the apiserver's exec and logs come to the Node's InternalIP. Only clients
	// of the cluster's CA get in (anonymous off).
	c.KubeletPort = freePort(t)
	cfg := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 0.0.0.0
port: %d
readOnlyPort: 0
healthzPort: 0
tlsCertFile: %q
tlsPrivateKeyFile: %q
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: %q}
authorization: {mode: AlwaysAllow}
containerRuntimeEndpoint: unix://%s
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
failCgroupV1: false
oomScoreAdj: 0
podLogsDir: %q
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "1Mi", nodefs.available: "1%%", imagefs.available: "1%%"}
syncFrequency: 10s
fileCheckFrequency: 10s
resolvConf: /etc/resolv.conf
featureGates:%s
`, c.KubeletPort, srvCert, srvKey, c.pki.CA, c.CRISocket, filepath.Join(c.Dir, "pod-logs"), gateYAML.String())
	cfgPath := filepath.Join(c.Dir, "kubelet.yaml")
	must(t, os.WriteFile(cfgPath, []byte(cfg), 0o644))

	c.Kubelet = startProc(t, "kubelet", filepath.Join(c.Dir, "kubelet.log"), nil,
		c.inNode(append([]string{filepath.Join(c.KubeBin, "kubelet"), "--config=" + cfgPath, "--kubeconfig=" + kubeconfig,
			"--root-dir=" + c.KubeletDir, "--hostname-override=" + c.node(), "--v=2"}, nodeIP...)...)...)
	if !waitFor(120*time.Second, func() bool { return c.nodeReady() || !c.Kubelet.Running() }) || !c.Kubelet.Running() {
		t.Fatalf("node %s did not become Ready:\n%s", c.node(), tail(c.Kubelet.Log, 60))
	}
}

// nodeReady reports whether the Node's Ready condition is True.
func (c *Cluster) nodeReady() bool {
	out, err := c.kubectlErr("get", "node", c.node(), "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
	return err == nil && out == "True"
}

// fakeDevices are real char device nodes under a temp dir of /dev whose major no driver owns:
// opening one inside a container fails with ENXIO when the device cgroup lets it through.
type fakeDevices struct {
	Dir   string
	Major uint32
	N     int
}

func mkDevices(t *testing.T, n int) *fakeDevices {
	t.Helper()
	procDevices, _ := os.ReadFile("/proc/devices")
	major := uint32(300)
	for strings.Contains(string(procDevices), fmt.Sprintf("\n%d ", major)) {
		major++
	}
	dir, err := os.MkdirTemp("/dev", "nri-accel-cluster-")
	must(t, err)
	d := &fakeDevices{Dir: dir, Major: major, N: n}
	for i := 0; i < n; i++ {
		must(t, d.Restore(i))
	}
	return d
}

func (d *fakeDevices) Path(i int) string { return filepath.Join(d.Dir, fmt.Sprintf("accel%d", i)) }

// Remove deletes the node of device i: nri-accel's next health check finds the device node gone
// and condemns the device (the test hook of docs/kubernetes.md, "Exercising device health").
func (d *fakeDevices) Remove(i int) error { return os.Remove(d.Path(i)) }

// Restore makes the node of device i (again), as mkDevices made it: the device turns healthy at
// nri-accel's next check.
func (d *fakeDevices) Restore(i int) error {
	minor := uint32(i)
	dev := uint64(minor&0xff) | uint64(d.Major&0xfff)<<8 | uint64(minor&^0xff)<<12 | uint64(d.Major&^0xfff)<<32
	if err := syscall.Mknod(d.Path(i), syscall.S_IFCHR|0o666, int(dev)); err != nil {
		return err
	}
	return os.Chmod(d.Path(i), 0o666)
}

// startAccel applies packaging/kubernetes (rbac.yaml and deviceclasses.yaml as shipped), gives
// nri-accel's service account a token bound to the node (so the shipped admission policy lets
// it write this node's slices), and runs nri-accel on the host as the node's NRI plugin and DRA
// driver (and device plugin with Options.DevicePlugin) with a static inventory of fake devices:
// `whole` (exclusive, WholeDevices devices, one NUMA-local CPU each), `shared0` (2 replicas)
// and `sliced0` (2 slots).
func (c *Cluster) startAccel(t *testing.T) {
	t.Helper()
	pkg := filepath.Join(testsDir(), "..", "packaging", "kubernetes")
	for _, f := range []string{"rbac.yaml", "deviceclasses.yaml"} {
		if out, err := c.kubectlErr("apply", "-f", filepath.Join(pkg, f)); err != nil {
			t.Fatalf("kubectl apply -f packaging/kubernetes/%s: %v\n%s", f, err, out)
		}
	}
	token := strings.TrimSpace(c.kubectl("create", "token", "nri-accel", "-n", "nri-accel",
		"--bound-object-kind", "Node", "--bound-object-name", c.node(), "--duration", "24h"))
	kubeconfig := c.pki.tokenKubeconfig(t, "nri-accel", c.Server, token)

	inventory := c.makeInventory(t)
	var b strings.Builder
	fmt.Fprintf(&b, "state_dir: %s\nnri:\n  socket: %s\nclaims_api:\n  socket: %s\ncdi:\n  dir: %s\n"+
		"reconcile_interval_secs: 0\n", c.StateDir, c.nriSocket(), filepath.Join(c.RunDir, "claims.sock"), c.CDIDir)
	if !c.Opts.NoDRA {
		fmt.Fprintf(&b, "dra:\n  enabled: true\n  driver_name: accel.nri.io\n  plugins_registry_dir: %s\n  plugins_dir: %s\n"+
			"kubernetes:\n  node_name: %s\n  kubeconfig: %s\n",
			filepath.Join(c.KubeletDir, "plugins_registry"), filepath.Join(c.KubeletDir, "plugins"), c.node(), kubeconfig)
	}
	if c.Opts.DevicePlugin {
		fmt.Fprintf(&b, "device_plugin:\n  enabled: true\n  dir: %s\n", filepath.Join(c.KubeletDir, "device-plugins"))
	}
	b.WriteString(inventory)
	config := b.String()
	if c.Opts.EditConfig != nil {
		config = c.Opts.EditConfig(t, c, config)
	}
	c.AccelCfg = filepath.Join(c.AccelDir, "config.yaml")
	must(t, os.WriteFile(c.AccelCfg, []byte(config), 0o644))
	if out, err := exec.Command(accelBin(t), "check-config", "--config", c.AccelCfg).CombinedOutput(); err != nil {
		t.Fatalf("nri-accel check-config: %v\n%s", err, out)
	}
	c.Accel = startProc(t, "nri-accel", filepath.Join(c.Dir, "nri-accel.log"), []string{"NRI_ACCEL_LOG=info"},
		accelBin(t), "run", "--config", c.AccelCfg)
	c.waitAccelReady(t)
}

// makeInventory makes the fake device nodes and answers the config's discovery and pools
// sections for them: pool `whole` (exclusive, WholeDevices devices, one NUMA-local CPU each, the
// last), `shared` (shared0, 2 replicas) and `sliced` (sliced0, 2 slots of profile half).
func (c *Cluster) makeInventory(t *testing.T) string {
	t.Helper()
	whole := c.Opts.WholeDevices
	if whole == 0 {
		whole = 1
	}
	c.Devs = mkDevices(t, whole+2)
	cpus, err := os.ReadFile("/sys/devices/system/cpu/online")
	must(t, err)
	c.CPUs = strings.TrimSpace(string(cpus))
	last := c.CPUs[strings.LastIndexAny(c.CPUs, ",-")+1:]
	c.LocalCPU = last
	var b strings.Builder
	fmt.Fprintf(&b, "discovery:\n  sysfs: false\n  cpus: %q\n", c.CPUs)
	if c.Opts.HealthCheckSecs > 0 {
		fmt.Fprintf(&b, "  health_check_secs: %d\n", c.Opts.HealthCheckSecs)
	}
	b.WriteString("  static_devices:\n")
	dev := func(i int, id string) {
		fmt.Fprintf(&b, "    - id: %s\n      vendor: e2e\n      model: fake\n      numa_node: 0\n      local_cpus: %q\n"+
			"      memory_mib: 16384\n      compute_units: 8\n      nodes:\n        - { path: %s, major: %d, minor: %d }\n",
			id, c.LocalCPU, c.Devs.Path(i), c.Devs.Major, i)
		if c.Opts.PCIAddresses {
			fmt.Fprintf(&b, "      pci_address: \"0000:%02x:00.0\"\n", 0x10+i)
		}
	}
	var ids []string
	for i := 0; i < whole; i++ {
		ids = append(ids, fmt.Sprintf("accel%d", i))
		dev(i, ids[i])
	}
	dev(whole, "shared0")
	dev(whole+1, "sliced0")
	cpusPerDevice := 1
	if c.Opts.NoExclusiveCPUs {
		cpusPerDevice = 0
	}
	fmt.Fprintf(&b, "pools:\n  - name: whole\n    select: { ids: [%s] }\n    family: { kind: exclusive }\n    cpus_per_device: %d\n",
		strings.Join(ids, ", "), cpusPerDevice)
	if c.Opts.Unhealthy != "" {
		fmt.Fprintf(&b, "    unhealthy: %s\n", c.Opts.Unhealthy)
	}
	b.WriteString("  - name: shared\n    select: { ids: [shared0] }\n    family: { kind: shared, replicas: 2, memory_mib_per_share: 8192 }\n")
	b.WriteString("  - name: sliced\n    select: { ids: [sliced0] }\n    family:\n      kind: sliced\n      slots: 2\n      profiles:\n" +
		"        - { name: half, size: 1, memory_mib: 8192, compute_units: 4, starts: [0, 1] }\n")
	return b.String()
}

// waitAccelReady waits until nri-accel's gate is open, its slices are published and the kubelet
// has registered its DRA driver.
func (c *Cluster) waitAccelReady(t *testing.T) {
	t.Helper()
	if !waitFor(90*time.Second, func() bool {
		st, err := c.AccelStatus()
		if err != nil || !c.Accel.Running() {
			return !c.Accel.Running()
		}
		gate, _ := st["gate"].(map[string]any)
		open, _ := gate["open"].(bool)
		state := field(st, "kubernetes", "resource_slices", "state")
		kubelet, _ := st["kubelet"].(map[string]any)
		dra, _ := kubelet["dra"].(map[string]any)
		if c.Opts.NoDRA {
			return open && c.allocatable("accel.nri.io/whole") > 0
		}
		return open && state == "published" && dra["registration"] == "registered"
	}) || !c.Accel.Running() {
		st, _ := c.AccelStatus()
		t.Fatalf("nri-accel did not come up (gate, published slices, kubelet registration); status %v\nlog:\n%s\nkubelet:\n%s",
			st, tail(c.Accel.Log, 40), tail(c.Kubelet.Log, 20))
	}
}

// AccelStatus is `nri-accel status --json`.
func (c *Cluster) AccelStatus() (map[string]any, error) {
	out, err := exec.Command(accelBin(c.t), "status", "--json", "--config", c.AccelCfg).Output()
	if err != nil {
		return nil, fmt.Errorf("status: %v", err)
	}
	var st map[string]any
	if err := json.Unmarshal(out, &st); err != nil {
		return nil, err
	}
	return st, nil
}

// criReady answers nil once the runtime's CRI reports RuntimeReady.
func criReady(socket string) error {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	st, err := cri.NewRuntimeServiceClient(conn).Status(ctx, &cri.StatusRequest{})
	if err != nil {
		return err
	}
	for _, cond := range st.GetStatus().GetConditions() {
		if cond.Type == cri.RuntimeReady && cond.Status {
			return nil
		}
	}
	return fmt.Errorf("runtime not ready")
}

// ExecIn runs cmd in the running container `container` of pod ns/name through the node's CRI
// (the kubelet's exec would make the API server dial the node's non-loopback address).
func (c *Cluster) ExecIn(ns, pod, container string, cmd ...string) (string, error) {
	conn, err := grpc.NewClient("unix://"+c.CRISocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return "", err
	}
	defer conn.Close()
	rt := cri.NewRuntimeServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	list, err := rt.ListContainers(ctx, &cri.ListContainersRequest{Filter: &cri.ContainerFilter{
		State: &cri.ContainerStateValue{State: cri.ContainerState_CONTAINER_RUNNING},
		LabelSelector: map[string]string{"io.kubernetes.pod.namespace": ns, "io.kubernetes.pod.name": pod,
			"io.kubernetes.container.name": container}}})
	if err != nil {
		return "", err
	}
	if len(list.Containers) != 1 {
		return "", fmt.Errorf("%d running containers %s in pod %s/%s", len(list.Containers), container, ns, pod)
	}
	r, err := rt.ExecSync(ctx, &cri.ExecSyncRequest{ContainerId: list.Containers[0].Id, Cmd: cmd, Timeout: 30})
	if err != nil {
		return "", err
	}
	if r.ExitCode != 0 {
		return string(r.Stdout), fmt.Errorf("%q exited %d: %s", strings.Join(cmd, " "), r.ExitCode, r.Stderr)
	}
	return string(r.Stdout), nil
}

// allocatable answers the Node's allocatable count of an extended resource (0 when absent).
func (c *Cluster) allocatable(resource string) int {
	out, err := c.kubectlErr("get", "node", c.node(), "-o", "jsonpath={.status.allocatable."+strings.ReplaceAll(resource, ".", "\\.")+"}")
	if err != nil {
		return 0
	}
	var n int
	fmt.Sscanf(out, "%d", &n)
	return n
}
