package e2e

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

// isCrio reports whether a version names CRI-O ("crio-v1.36.3") rather than containerd.
func isCrio(version string) bool { return strings.HasPrefix(version, "crio-") }

// Crio is one real CRI-O with its own root, runroot, sockets, runc root and namespaces dir under
// dir; conmon and runc are Debian's, pinns is built with CRI-O (tests/peers/crio-*/build.env).
type Crio struct {
	Version string
	Bin     string
	Dir     string
	Config  string
	Socket  string
	NRISock string
	CDIDir  string
	Log     string
	process
}

func newCrio(t *testing.T, version, dir, cdiDir string) *Crio {
	c := &Crio{
		Version: version,
		Bin:     peerBin(t, version),
		Dir:     dir,
		Config:  filepath.Join(dir, "crio.conf"),
		Socket:  filepath.Join(dir, "crio.sock"),
		NRISock: filepath.Join(dir, "nri.sock"),
		CDIDir:  cdiDir,
		Log:     filepath.Join(dir, "crio.log"),
		process: process{group: true},
	}
	for _, d := range []string{"cni", "cni-bin", "conf.d", "nri-plugins", "nri-conf"} {
		must(t, os.MkdirAll(filepath.Join(dir, d), 0o755))
	}
	must(t, os.WriteFile(filepath.Join(dir, "policy.json"), []byte(`{"default":[{"type":"insecureAcceptAnything"}]}`), 0o644))
	return c
}

func (c *Crio) config() string {
	d := c.Dir
	return fmt.Sprintf(`[crio]
root = %q
runroot = %q
storage_driver = "overlay"
log_dir = %q
version_file = %q
version_file_persist = %q
clean_shutdown_file = %q

[crio.api]
listen = %q
stream_address = "127.0.0.1"
stream_port = "0"

[crio.runtime]
default_runtime = "runc"
cgroup_manager = "cgroupfs"
conmon_cgroup = "pod"
namespaces_dir = %q
pinns_path = %q
container_exits_dir = %q
container_attach_socket_dir = %q
cdi_spec_dirs = [%q]
# Pods run on the host network with no port mappings; without this CRI-O refuses to start on a host
# with neither iptables nor nft ("can't create HostPortManager").
disable_hostport_mapping = true

[crio.runtime.runtimes.runc]
runtime_path = "/usr/sbin/runc"
runtime_type = "oci"
runtime_root = %q
monitor_path = "/usr/bin/conmon"
monitor_cgroup = "pod"

[crio.image]
pause_image = %q
signature_policy = %q

[crio.network]
network_dir = %q
plugin_dirs = [%q]

[crio.nri]
enable_nri = true
nri_listen = %q
nri_plugin_dir = %q
nri_plugin_config_dir = %q
nri_disable_connections = false
`, filepath.Join(d, "root"), filepath.Join(d, "runroot"), filepath.Join(d, "logs"),
		filepath.Join(d, "version"), filepath.Join(d, "version-persist"), filepath.Join(d, "clean.shutdown"),
		c.Socket, filepath.Join(d, "ns"), filepath.Join(c.Bin, "pinns"), filepath.Join(d, "exits"),
		filepath.Join(d, "attach"), c.CDIDir, filepath.Join(d, "runc"), imageRef,
		filepath.Join(d, "policy.json"), filepath.Join(d, "cni"), filepath.Join(d, "cni-bin"),
		c.NRISock, filepath.Join(d, "nri-plugins"), filepath.Join(d, "nri-conf"))
}

// Start runs CRI-O and waits until its CRI answers.
func (c *Crio) Start(t *testing.T) {
	t.Helper()
	must(t, os.WriteFile(c.Config, []byte(c.config()), 0o644))
	cmd := exec.Command(filepath.Join(c.Bin, "crio"), "--config", c.Config, "--config-dir", filepath.Join(c.Dir, "conf.d"),
		"--log-level", "info")
	c.start(t, cmd, c.Log, c.Version)
	if !c.awaitCRI(c.Socket) {
		t.Fatalf("%s did not come up (log %s):\n%s", c.Version, c.Log, tail(c.Log, 40))
	}
}

// ImportImage copies the suite's OCI archive into CRI-O's storage with Debian's skopeo.
func (c *Crio) ImportImage(t *testing.T) {
	t.Helper()
	archive := imageArchive(t, c.Dir)
	dest := fmt.Sprintf("containers-storage:[overlay@%s+%s]%s", filepath.Join(c.Dir, "root"), filepath.Join(c.Dir, "runroot"), imageRef)
	out, err := exec.Command("skopeo", "--policy", filepath.Join(c.Dir, "policy.json"), "copy", "oci-archive:"+archive, dest).CombinedOutput()
	if err != nil {
		t.Fatalf("skopeo copy into CRI-O's storage (apt-get install skopeo): %v\n%s", err, out)
	}
}

// Dump asks CRI-O for its goroutine dump (SIGUSR1: CRI-O writes /tmp/crio-goroutine-stacks-*.log)
// and appends it to CRI-O's log here.
func (c *Crio) Dump() {
	if !c.Running() {
		return
	}
	asked := time.Now().Add(-time.Second)
	c.signal(syscall.SIGUSR1)
	time.Sleep(time.Second)
	dumps, _ := filepath.Glob("/tmp/crio-goroutine-stacks-*.log")
	log, err := os.OpenFile(c.Log, os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return
	}
	defer log.Close()
	for _, d := range dumps {
		if st, err := os.Stat(d); err != nil || st.ModTime().Before(asked) {
			continue // another instance's
		}
		if b, err := os.ReadFile(d); err == nil {
			fmt.Fprintf(log, "\n===== e2e: CRI-O goroutine dump %s\n%s", d, b)
			_ = os.Remove(d)
		}
	}
}

// Stop stops CRI-O (SIGTERM, then SIGKILL after 10 s).
func (c *Crio) Stop() { c.stop(10*time.Second, nil) }

// Cleanup kills containers under its runc root and conmons of its dir, and unmounts its dir.
func (c *Crio) Cleanup() {
	cleanupRuntime(c.Dir, []string{filepath.Join(c.Dir, "runc")}, "conmon", c.Dir)
}

// CRISocket is CRI-O's socket.
func (c *Crio) CRISocket() string { return c.Socket }

// NRISocket is CRI-O's NRI socket.
func (c *Crio) NRISocket() string { return c.NRISock }

// Files are CRI-O's log and config.
func (c *Crio) Files() []string { return []string{c.Log, c.Config} }
