package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Node is one test's node: a containerd, an nri-accel and a CRI client, all under one temp dir.
type Node struct {
	Version string
	Mode    string
	Dir     string
	Devs    *fakeDevices
	// RT is the runtime under test; Ctd is the same runtime when it is containerd (else nil).
	RT    Runtime
	Ctd   *Containerd
	Accel *Accel
	CRI   *CRI
}

// Runtime is a container runtime under test (containerd or CRI-O) with its own dirs and sockets.
type Runtime interface {
	// Start runs it and waits until its CRI answers.
	Start(t *testing.T)
	// ImportImage makes the suite's busybox image (also the sandbox image) available.
	ImportImage(t *testing.T)
	// Stop stops it (SIGTERM, then SIGKILL); running containers stay.
	Stop()
	// Kill ends it at once.
	Kill()
	// Dump has it write its goroutine dump to its log.
	Dump()
	// Running reports whether its process is alive.
	Running() bool
	// Cleanup removes what it left: containers, monitors, mounts.
	Cleanup()
	// CRISocket and NRISocket are its sockets.
	CRISocket() string
	NRISocket() string
	// Files are its log and config, kept when a test fails.
	Files() []string
}

// NodeOptions change a node before it starts.
type NodeOptions struct {
	Layout Layout
	// Validator turns containerd's default NRI validator on.
	Validator bool
	// RequiredPlugins are the default validator's required plugins.
	RequiredPlugins []string
	// NoAccel leaves nri-accel unstarted.
	NoAccel bool
	// UnconfirmedGrantSecs sets nri.unconfirmed_grant_secs (0: the default).
	UnconfirmedGrantSecs int
}

// defaultLayout: the host's CPUs, accel0 local to the last CPU.
func defaultLayout(t *testing.T, cpusPerDevice int) Layout {
	cpus := onlineCPUs(t)
	if len(cpus) < 2 {
		t.Fatalf("the suite needs at least 2 online CPUs, this host has %v", cpus)
	}
	return Layout{
		CPUs:          fmt.Sprintf("%d-%d", cpus[0], cpus[len(cpus)-1]),
		LocalCPU:      fmt.Sprint(cpus[len(cpus)-1]),
		CPUsPerDevice: cpusPerDevice,
	}
}

// startNode starts containerd `version` with the suite's image and, unless opts.NoAccel,
// nri-accel as an external plugin in injection `mode`. Teardown is registered with t.Cleanup;
// when t failed, the logs go to the results dir.
func startNode(t *testing.T, version, mode string, opts NodeOptions) *Node {
	t.Helper()
	dir, err := os.MkdirTemp("", "nri-accel-e2e-")
	must(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) }) // also when the set-up below fails
	if opts.Layout.CPUs == "" {
		opts.Layout = defaultLayout(t, 0)
	}
	n := &Node{Version: version, Mode: mode, Dir: dir}
	n.Devs = mkDevices(t, 8)
	accelDir := filepath.Join(dir, "accel")
	must(t, os.MkdirAll(accelDir, 0o755))
	if isCrio(version) {
		n.RT = newCrio(t, version, filepath.Join(dir, "crio"), filepath.Join(accelDir, "cdi"))
	} else {
		n.Ctd = newContainerd(t, version, filepath.Join(dir, "containerd"), filepath.Join(accelDir, "cdi"))
		n.Ctd.Validator = opts.Validator
		n.Ctd.RequiredPlugins = opts.RequiredPlugins
		n.RT = n.Ctd
	}
	n.Accel = newAccel(t, accelDir, n.RT.NRISocket(), mode, opts.Layout, n.Devs)
	if opts.UnconfirmedGrantSecs > 0 {
		cfg, err := os.ReadFile(n.Accel.Config)
		must(t, err)
		cfg = []byte(strings.Replace(string(cfg), "nri:\n",
			fmt.Sprintf("nri:\n  unconfirmed_grant_secs: %d\n", opts.UnconfirmedGrantSecs), 1))
		must(t, os.WriteFile(n.Accel.Config, cfg, 0o644))
	}
	t.Cleanup(func() { n.teardown(t) })
	n.RT.Start(t)
	n.RT.ImportImage(t)
	n.connectCRI(t)
	if !opts.NoAccel {
		n.Accel.Start(t)
	}
	return n
}

func (n *Node) connectCRI(t *testing.T) {
	t.Helper()
	c, err := dialCRI(n.RT.CRISocket())
	must(t, err)
	if n.CRI != nil {
		n.CRI.Close()
	}
	n.CRI = c
}

// RestartContainerd stops containerd (containers keep running) and starts it again.
func (n *Node) RestartContainerd(t *testing.T) {
	t.Helper()
	n.RT.Stop()
	n.RT.Start(t)
	n.connectCRI(t)
}

// teardown removes every pod, stops both daemons, cleans up what containerd left and keeps the
// logs of a failed test.
func (n *Node) teardown(t *testing.T) {
	if t.Failed() {
		// A hung runtime: its goroutines say where.
		n.RT.Dump()
	}
	if n.CRI != nil && n.RT.Running() {
		n.CRI.Timeout = 20 * time.Second
		if pods, err := n.CRI.Pods(); err == nil {
			for _, p := range pods {
				if err := n.CRI.RemovePod(p); err != nil {
					t.Logf("teardown: removing pod %s: %v", p, err)
					if status.Code(err) == codes.DeadlineExceeded {
						t.Log("teardown: containerd does not answer; its containers are killed below")
						break
					}
				}
			}
		}
		n.CRI.Close()
	}
	n.Accel.Stop()
	n.RT.Stop()
	n.RT.Kill()
	n.RT.Cleanup()
	if t.Failed() {
		res := resultsDir(t)
		_ = os.MkdirAll(res, 0o755)
		for _, f := range append(n.RT.Files(), n.Accel.Log, n.Accel.Config) {
			_ = exec.Command("cp", f, res).Run()
		}
		_ = exec.Command("cp", "-r", n.Accel.CDIDir, filepath.Join(res, "cdi")).Run()
		t.Logf("logs of the failed test kept in %s", res)
	}
	_ = os.RemoveAll(n.Dir)
}

// mustRunPod runs a pod with these annotations or fails the test.
func (n *Node) mustRunPod(t *testing.T, name string, annotations map[string]string) *Pod {
	t.Helper()
	p, err := n.CRI.RunPod(name, annotations)
	if err != nil {
		t.Fatalf("RunPodSandbox %s: %v", name, err)
	}
	return p
}

// mustRun creates and starts container `name` in pod or fails the test.
func (n *Node) mustRun(t *testing.T, pod *Pod, name string) string {
	t.Helper()
	id, err := n.CRI.Run(pod, name)
	if err != nil {
		t.Fatalf("create/start container %s: %v", name, err)
	}
	return id
}

// status answers nri-accel's status or fails the test.
func (n *Node) status(t *testing.T) Status {
	t.Helper()
	st, err := n.Accel.Status()
	if err != nil {
		t.Fatalf("%v", err)
	}
	return st
}

// annotation is the annotation-path request of container `name`.
func annotation(name, value string) map[string]string {
	return map[string]string{"accel.nri.io/container." + name: value}
}

// awaitCPUs waits until container id's cpuset is want. On runtimes before NRI v0.12.1 nri-accel
// delivers CPU moves of running containers in the reply of the next CreateContainer or
// StopContainer, so there a plain container is created (the documented trigger) first.
func (n *Node) awaitCPUs(t *testing.T, id, want string) bool {
	t.Helper()
	if !pushesUpdates(n.Version) {
		p := n.mustRunPod(t, "trigger", nil)
		n.mustRun(t, p, "plain")
		if err := n.CRI.RemovePod(p.ID); err != nil {
			t.Fatalf("removing the trigger pod: %v", err)
		}
	}
	return waitFor(10*time.Second, func() bool { return n.cpusInside(t, id) == want })
}
