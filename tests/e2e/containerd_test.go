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

// Containerd is one real containerd with its own root, state, sockets and runc root under dir.
type Containerd struct {
	Version string
	Bin     string // the peer's bin dir (containerd, ctr, containerd-shim-runc-v2)
	Dir     string
	Config  string
	Socket  string
	NRISock string
	// PluginPath and PluginConfigPath are NRI's dirs of plugins containerd launches itself.
	PluginPath       string
	PluginConfigPath string
	CDIDir           string
	Log              string
	// Validator turns NRI's default validator on (containerd 2.2 and newer).
	Validator bool
	// RequiredPlugins are the default validator's required plugins.
	RequiredPlugins []string
	process
}

// newContainerd lays out a containerd of `version` under dir; Start runs it.
func newContainerd(t *testing.T, version, dir, cdiDir string) *Containerd {
	c := &Containerd{
		Version:          version,
		Bin:              peerBin(t, version),
		Dir:              dir,
		Config:           filepath.Join(dir, "config.toml"),
		Socket:           filepath.Join(dir, "containerd.sock"),
		NRISock:          filepath.Join(dir, "nri.sock"),
		PluginPath:       filepath.Join(dir, "nri-plugins"),
		PluginConfigPath: filepath.Join(dir, "nri-conf"),
		CDIDir:           cdiDir,
		Log:              filepath.Join(dir, "containerd.log"),
		process:          process{group: true},
	}
	for _, d := range []string{c.PluginPath, c.PluginConfigPath, filepath.Join(dir, "cni")} {
		must(t, os.MkdirAll(d, 0o755))
	}
	return c
}

// CRISocket is containerd's gRPC socket.
func (c *Containerd) CRISocket() string { return c.Socket }

// NRISocket is containerd's NRI socket.
func (c *Containerd) NRISocket() string { return c.NRISock }

// Files are containerd's log and config.
func (c *Containerd) Files() []string { return []string{c.Log, c.Config} }

// is1x reports whether this containerd reads config version 2 (1.x).
func (c *Containerd) is1x() bool { return strings.HasPrefix(c.Version, "v1.") }

// hasValidator reports whether this containerd has NRI's adjustment validation (2.2 and newer).
func (c *Containerd) hasValidator() bool {
	var major, minor int
	fmt.Sscanf(c.Version, "v%d.%d", &major, &minor)
	return major > 2 || (major == 2 && minor >= 2)
}

func (c *Containerd) config() string {
	d := c.Dir
	nri := fmt.Sprintf(`
  disable = false
  disable_connections = false
  socket_path = %q
  plugin_path = %q
  plugin_config_path = %q
  plugin_registration_timeout = "5s"
  plugin_request_timeout = "2s"
`, c.NRISock, c.PluginPath, c.PluginConfigPath)
	common := fmt.Sprintf(`root = %q
state = %q
[grpc]
  address = %q
[ttrpc]
  address = %q
[debug]
  level = "info"
`, filepath.Join(d, "root"), filepath.Join(d, "state"), c.Socket, c.Socket+".ttrpc")
	if c.is1x() {
		return fmt.Sprintf(`version = 2
%s
[plugins."io.containerd.internal.v1.opt"]
  path = %q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  enable_cdi = true
  cdi_spec_dirs = [%q]
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    conf_dir = %q
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = %q
[plugins."io.containerd.nri.v1.nri"]%s`, common, filepath.Join(d, "opt"), imageRef, c.CDIDir,
			filepath.Join(d, "cni"), filepath.Join(d, "runc"), nri)
	}
	validator := ""
	if c.Validator {
		validator = "\n[plugins.'io.containerd.nri.v1.nri'.default_validator]\n  enable = true\n"
		if len(c.RequiredPlugins) > 0 {
			var quoted []string
			for _, p := range c.RequiredPlugins {
				quoted = append(quoted, fmt.Sprintf("%q", p))
			}
			validator += fmt.Sprintf("  required_plugins = [%s]\n", strings.Join(quoted, ", "))
		}
	}
	return fmt.Sprintf(`version = 3
%s
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
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    conf_dir = %q
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        Root = %q
[plugins.'io.containerd.nri.v1.nri']%s%s`, common, filepath.Join(d, "opt"), imageRef, c.CDIDir,
		filepath.Join(d, "cni"), filepath.Join(d, "runc"), nri, validator)
}

// Start runs containerd and waits until its CRI answers.
func (c *Containerd) Start(t *testing.T) {
	t.Helper()
	must(t, os.WriteFile(c.Config, []byte(c.config()), 0o644))
	cmd := exec.Command(filepath.Join(c.Bin, "containerd"), "--config", c.Config)
	cmd.Env = append(os.Environ(), "PATH="+c.Bin+":"+os.Getenv("PATH"))
	c.start(t, cmd, c.Log, "containerd "+c.Version)
	if !c.awaitCRI(c.Socket) {
		t.Fatalf("containerd %s did not come up (log %s):\n%s", c.Version, c.Log, tail(c.Log, 40))
	}
}

// Ctr runs this containerd's ctr in the k8s.io namespace.
func (c *Containerd) Ctr(args ...string) (string, error) {
	cmd := exec.Command(filepath.Join(c.Bin, "ctr"), append([]string{"--address", c.Socket, "-n", "k8s.io"}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// ImportImage imports the suite's busybox image (also the sandbox image).
func (c *Containerd) ImportImage(t *testing.T) {
	t.Helper()
	archive := imageArchive(t, c.Dir)
	if out, err := c.Ctr("images", "import", archive); err != nil {
		t.Fatalf("ctr images import: %v\n%s", err, out)
	}
	out, err := c.Ctr("images", "ls", "-q")
	if err != nil || !strings.Contains(out, imageRef) {
		t.Fatalf("imported image %s not listed: %v\n%s", imageRef, err, out)
	}
}

// Dump asks containerd for its goroutine dump (written to its log).
func (c *Containerd) Dump() {
	if c.Running() {
		c.signal(syscall.SIGUSR1)
		time.Sleep(time.Second)
	}
}

// Stop stops containerd (SIGTERM, then a goroutine dump and SIGKILL after 10 s); running
// containers stay.
func (c *Containerd) Stop() { c.stop(10*time.Second, c.Dump) }

// Cleanup removes whatever this containerd left: containers under its runc root, shims started
// for its socket, and mounts under its dir.
func (c *Containerd) Cleanup() {
	var roots []string
	runcRoot := filepath.Join(c.Dir, "runc")
	if ents, err := os.ReadDir(runcRoot); err == nil {
		for _, ns := range ents {
			roots = append(roots, filepath.Join(runcRoot, ns.Name()))
		}
	}
	// Shims of this containerd carry its socket's address on their command line.
	cleanupRuntime(c.Dir, roots, "containerd-shim", c.Socket)
}
