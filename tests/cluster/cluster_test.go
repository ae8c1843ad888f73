// Package cluster runs nri-accel on a real single-node Kubernetes cluster: etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler and the kubelet, built from their Go modules at release
// tags by ../peers/build.sh, on the end-to-end suite's real containerd. nri-accel runs on the host
// (its release binary) as the node's NRI plugin and DRA driver, and in scenario i from its image
// as the shipped DaemonSet and the Helm release. tests/README.md, "The cluster suite", says what
// each scenario proves and what this sandbox needs.
package cluster

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"nri-accel/tests/internal/ociimage"

	"nri-accel/tests/internal/suite"
)

// The Kubernetes versions of a plain run; NRI_ACCEL_CLUSTER_KUBE overrides (comma list).
const defaultKube = "v1.34.4,v1.37.2"

// The containerd the kubelet runs on (the newest of the end-to-end suite).
const containerdPeer = "containerd-v2.4.2"

const etcdPeer = "etcd-v3.6.16"

// The node's name in Kubernetes (and nri-accel's pool).
const nodeName = "nri-accel-node"

// The DRA gates nri-accel publishes for or the scenarios use, turned on in every component that
// knows them (each binary's -h lists its gates; a gate it does not list is left out).
var wantGates = []string{
	"DRAPartitionableDevices", "DRAConsumableCapacity", "DRADeviceTaints", "DRAResourceClaimDeviceStatus",
	"DRAPrioritizedList", "DRAAdminAccess", "DRAExtendedResource",
	// Device health in the pod's status (KEP-4680): alpha on 1.34, beta and on by default from
	// 1.36, the health message beside it from 1.37 (scenario f).
	"ResourceHealthStatus", "ResourceHealthStatusMessage",
}

func testsDir() string { return suite.TestsDir() }

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("SKIPPED: the cluster suite needs root (it runs containerd, the kubelet, runc and mknod); " +
			"run it as root: sudo bash tests/cluster.sh test")
	}
}

func kubeVersions() []string { return suite.List("NRI_ACCEL_CLUSTER_KUBE", defaultKube) }

// buildPeer is the bin dir of peer (a dir under tests/peers), built or found in the cache.
func buildPeer(t *testing.T, peer string) string {
	t.Helper()
	dir, err := suite.BuildPeer(peer)
	must(t, err)
	return dir
}

func accelBin(t *testing.T) string {
	t.Helper()
	bin, err := suite.AccelBin()
	must(t, err)
	return bin
}

// Options shape a cluster.
type Options struct {
	// DevicePlugin serves nri-accel's device plugins (scenario e).
	DevicePlugin bool
	// NoDRA leaves nri-accel's DRA side off (a cluster that uses the device plugins only).
	NoDRA bool
	// WholeDevices is how many devices pool whole has (default 1).
	WholeDevices int
	// HealthCheckSecs is nri-accel's discovery.health_check_secs (0: its default, 10 s).
	HealthCheckSecs int
	// NoExclusiveCPUs sets cpus_per_device 0 on pool whole (default 1). The policy always keeps
	// one CPU shared, so on a 2-CPU machine a second whole device with its own CPU cannot be
	// held while the first is.
	NoExclusiveCPUs bool
	// NoHostAccel starts no nri-accel on the host: the test deploys it (scenario i).
	NoHostAccel bool
	// Unhealthy is pool whole's `unhealthy` field ("": the default, withdraw; scenario l).
	Unhealthy string
	// EditConfig, when set, rewrites nri-accel's config before it is checked and started (the
	// scenarios that need pools or sections of their own, such as scenario n's passthrough pool).
	EditConfig func(t *testing.T, c *Cluster, config string) string
	// ExtraGates are turned on too, where a component lists them (scenario k: an alpha gate
	// the other scenarios leave at its default).
	ExtraGates []string
	// Nodes is how many nodes the cluster has (fleet_test.go). 0 or 1: the single node
	// nodeName, on the machine's network, as every scenario but the fleet's uses. From 2: nodes
	// fleet-1 .. fleet-N, each in mount and network namespaces of its own, with its own
	// containerd, kubelet and fake devices, and nothing of nri-accel on them (the fleet installs
	// the chart); the controller-manager and the apiserver then declare a node lost and evict its
	// pods within about 30 s (fleetFlags).
	Nodes int
	// PCIAddresses gives every static device a PCI address (0000:<10+i>:00.0), so the slices
	// carry pciAddress and the standard resource.kubernetes.io/pciBusID (scenario m).
	PCIAddresses bool
}

// Cluster is one single-node cluster under Dir.
type Cluster struct {
	Version string
	Dir     string
	KubeBin string
	pki     *pki
	Server  string // https://127.0.0.1:<port>
	Admin   string // the admin kubeconfig
	Gates   map[string]string
	Opts    Options

	Etcd, APIServer, ControllerManager, Scheduler, Containerd, Kubelet, Accel *proc
	// NodeNS holds the node's mount namespace (nodens_test.go); PodNet serves the pods' network.
	NodeNS *proc
	PodNet *podNet

	CRISocket  string
	KubeletDir string
	// KubeletPort is the kubelet's HTTPS port, on every address (/metrics, exec, logs; x509 clients of the CA).
	KubeletPort int
	Devs        *fakeDevices
	// AccelDir holds the host binary's config; StateDir, RunDir and CDIDir are the node's
	// /var/lib/nri-accel, /run/nri-accel and /var/run/cdi.
	AccelDir string
	AccelCfg string
	StateDir string
	RunDir   string
	CDIDir   string
	LocalCPU string
	// running and pending are the pods scenario c leaves for d.
	running, pending string
	// madeDirs are the mount points made on the machine for the node's binds, removed by the
	// teardown.
	madeDirs []string
	CPUs     string
	t        *testing.T

	// The fleet (Options.Nodes > 1, fleet_test.go). Nodes are the cluster's nodes, the first
	// being c itself; each of the others is a Cluster too, sharing c's control plane (its
	// Server, Admin and CA) and holding its own node's fields (Dir, NodeNS, Containerd, Kubelet,
	// CDIDir, ...). NodeName is the node's name ("": nodeName), NodeIP its address in its own
	// network namespace ("": the machine's network), podSubnet the first octets of its pods'
	// addresses ("": 10.244.). control is the cluster a node belongs to (nil on the first).
	Nodes     []*Cluster
	NodeName  string
	NodeIP    string
	podSubnet string
	control   *Cluster
	// forwards are the node's listeners for the apiserver in its network namespace.
	forwards []io.Closer
}

// node is the name of c's node in Kubernetes.
func (c *Cluster) node() string {
	if c.NodeName != "" {
		return c.NodeName
	}
	return nodeName
}

// Start brings the cluster of Kubernetes `version` up under a new temp dir and registers its
// teardown with t.
func Start(t *testing.T, version string, opts Options) *Cluster {
	t.Helper()
	requireRoot(t)
	kubeBin := buildPeer(t, "kubernetes-"+version)
	etcdBin := buildPeer(t, etcdPeer)
	ctrdBin := buildPeer(t, containerdPeer)
	dir, err := os.MkdirTemp("", "nri-accel-cluster-")
	must(t, err)
	c := &Cluster{Version: version, Dir: dir, KubeBin: kubeBin, Opts: opts, t: t}
	t.Cleanup(c.Teardown)
	c.pki = newPKI(t, filepath.Join(dir, "pki"))

	// etcd on loopback, without fsync (a test cluster's data does not outlive it).
	ec, ep := freePort(t), freePort(t)
	c.Etcd = startProc(t, "etcd", filepath.Join(dir, "etcd.log"), nil, filepath.Join(etcdBin, "etcd"),
		"--name=default", "--data-dir="+filepath.Join(dir, "etcd"),
		fmt.Sprintf("--listen-client-urls=http://127.0.0.1:%d", ec), fmt.Sprintf("--advertise-client-urls=http://127.0.0.1:%d", ec),
		fmt.Sprintf("--listen-peer-urls=http://127.0.0.1:%d", ep), fmt.Sprintf("--initial-advertise-peer-urls=http://127.0.0.1:%d", ep),
		fmt.Sprintf("--initial-cluster=default=http://127.0.0.1:%d", ep), "--unsafe-no-fsync", "--log-level=warn",
		"--listen-metrics-urls=", "--auto-compaction-retention=1h")

	// kube-apiserver on loopback. No endpoint reconciler: the kubernetes Service's endpoint would
	// be 127.0.0.1, which Endpoints validation refuses, and nothing here dials the Service.
	ap := freePort(t)
	c.Server = fmt.Sprintf("https://127.0.0.1:%d", ap)
	srvCert, srvKey := c.pki.issue(t, "apiserver", "kube-apiserver", nil, "127.0.0.1", "10.96.0.1", "localhost",
		"kubernetes", "kubernetes.default", "kubernetes.default.svc")
	kcCert, kcKey := c.pki.issue(t, "apiserver-kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"})
	c.Gates = map[string]string{}
	c.APIServer = startProc(t, "kube-apiserver", filepath.Join(dir, "kube-apiserver.log"), nil, append([]string{
		filepath.Join(kubeBin, "kube-apiserver"),
		fmt.Sprintf("--etcd-servers=http://127.0.0.1:%d", ec), "--bind-address=127.0.0.1", fmt.Sprintf("--secure-port=%d", ap),
		"--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none",
		"--tls-cert-file=" + srvCert, "--tls-private-key-file=" + srvKey, "--client-ca-file=" + c.pki.CA,
		"--kubelet-client-certificate=" + kcCert, "--kubelet-client-key=" + kcKey, "--kubelet-certificate-authority=" + c.pki.CA,
		"--kubelet-preferred-address-types=InternalIP",
		"--service-account-issuer=https://kubernetes.default.svc", "--service-account-key-file=" + c.pki.SAPub,
		"--service-account-signing-key-file=" + c.pki.SAKey, "--service-cluster-ip-range=10.96.0.0/24",
		"--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction", "--allow-privileged=true",
		"--profiling=false", "--feature-gates=" + c.gatesFor(t, "kube-apiserver"), "--runtime-config=" + c.runtimeConfig()},
		c.fleetFlags("kube-apiserver")...)...)
	c.Admin = c.pki.kubeconfig(t, "admin", c.Server, "nri-accel-cluster-admin", "system:masters")
	if !waitFor(90*time.Second, func() bool {
		out, err := c.kubectlErr("get", "--raw", "/readyz")
		return err == nil && strings.TrimSpace(out) == "ok" || !c.APIServer.Running()
	}) || !c.APIServer.Running() {
		t.Fatalf("kube-apiserver %s did not become ready:\n%s\netcd:\n%s", version, tail(c.APIServer.Log, 40), tail(c.Etcd.Log, 10))
	}

	cmKube := c.pki.kubeconfig(t, "controller-manager", c.Server, "system:kube-controller-manager")
	c.ControllerManager = startProc(t, "kube-controller-manager", filepath.Join(dir, "kube-controller-manager.log"), nil, append([]string{
		filepath.Join(kubeBin, "kube-controller-manager"),
		"--kubeconfig=" + cmKube, "--authentication-kubeconfig=" + cmKube, "--authorization-kubeconfig=" + cmKube,
		"--bind-address=127.0.0.1", "--secure-port=0", "--leader-elect=false",
		"--service-account-private-key-file=" + c.pki.SAKey, "--root-ca-file=" + c.pki.CA, "--use-service-account-credentials=true",
		"--controllers=*", "--feature-gates=" + c.gatesFor(t, "kube-controller-manager")},
		c.fleetFlags("kube-controller-manager")...)...)
	schedKube := c.pki.kubeconfig(t, "scheduler", c.Server, "system:kube-scheduler")
	c.Scheduler = startProc(t, "kube-scheduler", filepath.Join(dir, "kube-scheduler.log"), nil,
		filepath.Join(kubeBin, "kube-scheduler"),
		"--kubeconfig="+schedKube, "--authentication-kubeconfig="+schedKube, "--authorization-kubeconfig="+schedKube,
		"--bind-address=127.0.0.1", "--secure-port=0", "--leader-elect=false",
		"--feature-gates="+c.gatesFor(t, "kube-scheduler"))

	c.KubeletDir = filepath.Join(dir, "kubelet")
	c.CDIDir = filepath.Join(dir, "cdi")
	c.AccelDir = filepath.Join(dir, "nri-accel")
	c.StateDir, c.RunDir = filepath.Join(c.AccelDir, "state"), filepath.Join(c.AccelDir, "run")
	if opts.Nodes > 1 {
		c.startFleet(t, ctrdBin)
	} else {
		c.startNodeNamespace(t)
		c.startContainerd(t, ctrdBin)
		c.startKubelet(t)
		if !opts.NoHostAccel {
			c.startAccel(t)
		}
	}
	// Pods are refused until the controller-manager made the namespace's service account.
	if !waitFor(60*time.Second, func() bool {
		_, err := c.kubectlErr("get", "serviceaccount", "default", "-n", "default")
		return err == nil
	}) {
		t.Fatalf("no service account default/default:\n%s", tail(c.ControllerManager.Log, 20))
	}
	return c
}

// gatesFor answers the --feature-gates value for component: each of wantGates that its -h lists.
func (c *Cluster) gatesFor(t *testing.T, component string) string {
	t.Helper()
	out, _ := exec.Command(filepath.Join(c.KubeBin, component), "-h").CombinedOutput()
	var on []string
	for _, g := range append(append([]string{}, wantGates...), c.Opts.ExtraGates...) {
		re := regexp.MustCompile(`\b` + g + `=true\|false \((ALPHA|BETA|GA)`)
		if m := re.FindStringSubmatch(string(out)); m != nil {
			on = append(on, g+"=true")
			c.Gates[g] = m[1]
		}
	}
	return strings.Join(on, ",")
}

// runtimeConfig turns on the resource.k8s.io versions the gated kinds need (DeviceTaintRule is
// in an alpha or beta version where DRADeviceTaints is not GA).
// (the scheduler waits for every informer it starts, so a gate whose API is not served leaves
// every pod unscheduled).
func (c *Cluster) runtimeConfig() string {
	rc := "resource.k8s.io/v1=true"
	if c.Gates["DRADeviceTaints"] == "ALPHA" {
		rc += ",resource.k8s.io/v1alpha3=true"
	}
	return rc
}

// kubectl runs kubectl as the cluster's admin and answers its stdout; a failure fails the test.
func (c *Cluster) kubectl(args ...string) string {
	c.t.Helper()
	out, err := c.kubectlErr(args...)
	if err != nil {
		c.t.Fatalf("kubectl %s: %v", strings.Join(args, " "), err)
	}
	return out
}

// kubectlErr runs kubectl as the cluster's admin: stdout, and an error carrying stderr.
func (c *Cluster) kubectlErr(args ...string) (string, error) {
	return c.kubectlIn("", args...)
}

// kubectlIn runs kubectl with stdin.
func (c *Cluster) kubectlIn(stdin string, args ...string) (string, error) {
	recordRun(append([]string{"kubectl"}, args...)...)
	cmd := exec.Command(filepath.Join(c.KubeBin, "kubectl"), append([]string{"--kubeconfig", c.Admin, "--request-timeout=30s"}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%v: %s", err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

// apply applies YAML from stdin.
func (c *Cluster) apply(yaml string) {
	c.t.Helper()
	if out, err := c.kubectlIn(yaml, "apply", "-f", "-"); err != nil {
		c.t.Fatalf("kubectl apply: %v\n%s\n%s", err, out, yaml)
	}
}

// Teardown stops every component, removes what the containers left (runc containers, shims,
// mounts, device nodes) and the temp dir, unless NRI_ACCEL_CLUSTER_KEEP is set, when the dir
// stays for reading. A failed test's logs are copied under tests/results first.
func (c *Cluster) Teardown() {
	if c.t.Failed() && c.control == nil {
		c.keepLogs()
	}
	for _, f := range c.forwards {
		f.Close()
	}
	for _, p := range []*proc{c.Kubelet, c.Accel, c.Scheduler, c.ControllerManager, c.APIServer, c.Etcd} {
		if p != nil {
			p.Stop(10 * time.Second)
		}
	}
	if c.Containerd != nil {
		c.Containerd.Stop(10 * time.Second)
	}
	c.PodNet.Stop()
	killUnder(c.Dir)
	// The last process in the node's mount namespace gone, its mounts (binds, volumes, container
	// root filesystems) go with it.
	if c.NodeNS != nil {
		c.NodeNS.Stop(5 * time.Second)
	}
	suite.UnmountUnder(c.Dir)
	if c.Devs != nil {
		os.RemoveAll(c.Devs.Dir)
	}
	c.removeMadeDirs()
	if os.Getenv("NRI_ACCEL_CLUSTER_KEEP") == "" {
		os.RemoveAll(c.Dir)
	}
}

// keepLogs copies the components' logs and configs and nri-accel's CDI specs to
// tests/results/<test>/.
func (c *Cluster) keepLogs() {
	base := os.Getenv("NRI_ACCEL_E2E_RESULTS")
	if base == "" {
		base = filepath.Join(testsDir(), "results")
	}
	out := filepath.Join(base, strings.ReplaceAll(c.t.Name(), "/", "_"))
	_ = os.MkdirAll(out, 0o755)
	files, _ := filepath.Glob(filepath.Join(c.Dir, "*.log"))
	more, _ := filepath.Glob(filepath.Join(c.Dir, "*", "*.yaml"))
	files = append(files, more...)
	more, _ = filepath.Glob(filepath.Join(c.Dir, "*.toml"))
	files = append(files, more...)
	// The fleet's other nodes (fleet_test.go): their logs, configs and containers' logs.
	for _, pat := range []string{"node-*/*.log", "node-*/*.toml", "node-*/*.yaml", "node-*/pod-logs/*/*/*.log"} {
		more, _ = filepath.Glob(filepath.Join(c.Dir, pat))
		files = append(files, more...)
	}
	// The containers' logs (nri-accel's own when it runs in a pod: scenario i).
	more, _ = filepath.Glob(filepath.Join(c.Dir, "pod-logs", "*", "*", "*.log"))
	files = append(files, more...)
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil {
			rel, _ := filepath.Rel(c.Dir, f)
			_ = os.WriteFile(filepath.Join(out, strings.ReplaceAll(rel, "/", "_")), b, 0o644)
		}
	}
	if o, err := c.kubectlErr("get", "pods,resourceclaims,resourceslices,events", "-A", "-o", "wide"); err == nil {
		_ = os.WriteFile(filepath.Join(out, "kubectl-get.txt"), []byte(o), 0o644)
	}
	c.t.Logf("logs kept under %s", out)
}

// imageRef is the suite's only image.
const imageRef = ociimage.Ref

// minor is the Kubernetes minor version (34 for v1.34.4).
func (c *Cluster) minor() int {
	var major, minor int
	fmt.Sscanf(c.Version, "v%d.%d", &major, &minor)
	return minor
}
