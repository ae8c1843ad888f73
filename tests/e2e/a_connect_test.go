package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Scenario a, external: nri-accel connects to containerd's NRI socket, Synchronize completes and
// `status` shows the gate open; a container created afterwards without annotations runs.
func TestA_ExternalPluginConnects(t *testing.T) {
	eachVersionAndMode(t, func(t *testing.T, v, mode string) {
		n := startNode(t, v, mode, NodeOptions{})
		st := n.status(t)
		if !st.GateOpen() {
			t.Fatalf("gate closed after registration: %v", st)
		}
		p := n.mustRunPod(t, "plain", nil)
		n.mustRun(t, p, "app")
		if !fileContains(n.Accel.Log, "synchronized with the runtime") {
			t.Errorf("nri-accel's log does not say it synchronized:\n%s", tail(n.Accel.Log, 20))
		}
	})
}

// Scenario a, launched: containerd starts nri-accel itself from its NRI plugin path (a wrapper
// named 10-accel) with the config in its NRI plugin config dir; the gate opens and a grant works.
// containerd 1.7.0 (NRI v0.3.0) configures the plugins it launches but never sends them
// Synchronize (NRI v0.8.0 does): there the gate must stay closed and no device may be granted
// blind.
func TestA_LaunchedByContainerd(t *testing.T) {
	eachVersionAndMode(t, func(t *testing.T, v, mode string) {
		n := startNodeLaunched(t, v, mode)
		if nriOf[v] == "v0.3.0" {
			if !waitFor(30*time.Second, func() bool { return fileContains(n.Accel.Log, "configured by the runtime") }) {
				t.Fatalf("containerd did not configure the plugin it launched:\n%s", tail(n.Accel.Log, 20))
			}
			time.Sleep(3 * time.Second)
			if st := n.status(t); st.GateOpen() {
				t.Fatal("the gate opened without Synchronize")
			}
			p := n.mustRunPod(t, "launched", annotation("app", exclusiveAsk))
			id, err := n.CRI.Run(p, "app")
			t.Logf("NRI v0.3.0, launched plugin, gate closed: an annotated container's create/start says %v", err)
			if err == nil {
				if _, serr := n.CRI.Exec(id, "stat", n.Devs.Path(0)); serr == nil {
					t.Error("a device was granted with the gate closed")
				}
			}
			if len(n.Accel.SpecFiles()) != 0 {
				t.Errorf("specs written with the gate closed: %v", n.Accel.SpecFiles())
			}
			return
		}
		n.Accel.WaitGate(t)
		st := n.status(t)
		if !st.GateOpen() {
			t.Fatalf("gate closed: %v", st)
		}
		p := n.mustRunPod(t, "launched", annotation("app", "count=1,family=exclusive"))
		id := n.mustRun(t, p, "app")
		dev := n.Devs.Path(0)
		if out, err := n.CRI.Exec(id, "stat", "-c", "%F", dev); err != nil || out != "character special file\n" {
			t.Fatalf("the launched plugin's grant did not reach the container: %q %v", out, err)
		}
	})
}

// startNodeLaunched is startNode with nri-accel installed in containerd's NRI plugin path
// instead of started by the suite.
func startNodeLaunched(t *testing.T, v, mode string) *Node {
	t.Helper()
	if isCrio(v) {
		t.Skip("SKIPPED: the launched-plugin case is written for containerd only; CRI-O is tested with nri-accel as an external plugin")
	}
	dir, err := os.MkdirTemp("", "nri-accel-e2e-")
	must(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) }) // also when the set-up below fails
	n := &Node{Version: v, Mode: mode, Dir: dir}
	n.Devs = mkDevices(t, 8)
	accelDir := filepath.Join(dir, "accel")
	must(t, os.MkdirAll(accelDir, 0o755))
	n.Ctd = newContainerd(t, v, filepath.Join(dir, "containerd"), filepath.Join(accelDir, "cdi"))
	n.Accel = newAccel(t, accelDir, n.Ctd.NRISock, mode, defaultLayout(t, 0), n.Devs)
	t.Cleanup(func() { n.teardown(t) })
	// The config lives in containerd's NRI plugin config dir; the runtime passes no arguments,
	// so a wrapper names the subcommand and the config.
	conf := filepath.Join(n.Ctd.PluginConfigPath, "10-accel.yaml")
	cfg, err := os.ReadFile(n.Accel.Config)
	must(t, err)
	must(t, os.WriteFile(conf, cfg, 0o644))
	n.Accel.Config = conf
	wrapper := fmt.Sprintf("#!/bin/sh\nexec %s run --config %s >>%s 2>&1\n", n.Accel.Bin, conf, n.Accel.Log)
	must(t, os.WriteFile(filepath.Join(n.Ctd.PluginPath, "10-accel"), []byte(wrapper), 0o755))
	n.RT = n.Ctd
	n.Ctd.Start(t)
	n.Ctd.ImportImage(t)
	n.connectCRI(t)
	return n
}
