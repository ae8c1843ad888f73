package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Scenario l: a shared pool in MPS mode on real containerd, with a stand-in for the MPS control
// daemon's directories (no GPU, no daemon: a pipe directory holding a file named like the
// daemon's control pipe, and a log directory). While the pipe directory is missing the pool's
// device is unhealthy in status with the sentence naming it, and a share asked through the
// annotation path or the claims API is refused with it; it heals when the directory appears. A container holding a share through the annotation path, and one given the CDI
// device of a claims-API claim by containerd's own CDI injection, each see both directories
// mounted at their paths (the stand-in pipe inside, the log directory writable) and
// CUDA_MPS_PIPE_DIRECTORY / CUDA_MPS_LOG_DIRECTORY set beside the share's limit.
func TestL_MPSPool(t *testing.T) {
	eachVersion(t, func(t *testing.T, v string) {
		mps, err := os.MkdirTemp("", "nri-accel-e2e-mps-")
		must(t, err)
		t.Cleanup(func() { os.RemoveAll(mps) })
		pipe, logDir := filepath.Join(mps, "pipe"), filepath.Join(mps, "log")
		must(t, os.MkdirAll(logDir, 0o755))
		layout := defaultLayout(t, 0)
		layout.MPSPipe, layout.MPSLog, layout.HealthCheckSecs = pipe, logDir, 1
		n := startNode(t, v, modes(v)[0], NodeOptions{Layout: layout})

		// No pipe directory: shared0 is unhealthy, and status says why.
		reason := func() string {
			st, err := n.Accel.Status()
			if err != nil {
				return "status: " + err.Error()
			}
			u, _ := st["device_health"].(map[string]any)["unhealthy"].(map[string]any)
			r, _ := u["shared0"].(string)
			return r
		}
		missing := "the MPS pipe directory " + pipe + " of device shared0 is missing"
		if r := reason(); !strings.Contains(r, missing) {
			t.Fatalf("shared0 without its MPS pipe directory: unhealthy reason %q", r)
		}
		// Not a silent grant: a container asking for a share is refused with the sentence, and
		// so is a claims-API claim.
		early := n.mustRunPod(t, "mps-early", annotation("app", "family=shared"))
		if _, err := n.CRI.Run(early, "app"); err == nil || !strings.Contains(err.Error(), "cannot be handed out now: "+missing) {
			t.Errorf("a share of shared0 without its pipe directory: %v", err)
		}
		if _, errs, err := n.Accel.CLI("prepare", "mps-early", "--family", "shared", "--device", "shared0"); err == nil || !strings.Contains(errs, missing) {
			t.Errorf("a claims-API claim of shared0 without its pipe directory: %v %s", err, errs)
		}
		n.assertNothingHeld(t)
		must(t, n.CRI.RemovePod(early.ID))
		// The daemon's directory appears: healthy at a later check.
		must(t, os.MkdirAll(pipe, 0o755))
		must(t, os.WriteFile(filepath.Join(pipe, "control"), nil, 0o600))
		if !waitFor(15*time.Second, func() bool { return reason() == "" }) {
			t.Fatalf("shared0 still unhealthy after its pipe directory appeared: %q", reason())
		}

		check := func(door, id string) {
			t.Helper()
			env := n.envInside(t, id)
			if env["CUDA_MPS_PIPE_DIRECTORY"] != pipe || env["CUDA_MPS_LOG_DIRECTORY"] != logDir {
				t.Errorf("%s: CUDA_MPS_PIPE_DIRECTORY=%q CUDA_MPS_LOG_DIRECTORY=%q, want %s and %s",
					door, env["CUDA_MPS_PIPE_DIRECTORY"], env["CUDA_MPS_LOG_DIRECTORY"], pipe, logDir)
			}
			if env["ACCEL_SHARE_MEMORY_LIMIT_MIB"] != "8192" {
				t.Errorf("%s: the share's limit ACCEL_SHARE_MEMORY_LIMIT_MIB=%q", door, env["ACCEL_SHARE_MEMORY_LIMIT_MIB"])
			}
			if out, err := n.CRI.Exec(id, "ls", pipe); err != nil || strings.TrimSpace(out) != "control" {
				t.Errorf("%s: ls %s inside: %q %v", door, pipe, out, err)
			}
			mounts, err := n.CRI.Exec(id, "cat", "/proc/self/mountinfo")
			if err != nil || !strings.Contains(mounts, " "+pipe+" ") || !strings.Contains(mounts, " "+logDir+" ") {
				t.Errorf("%s: %s and %s are not mount points inside: %v\n%s", door, pipe, logDir, err, mounts)
			}
			mark := filepath.Join(logDir, door+".log")
			if _, err := n.CRI.Exec(id, "sh", "-c", "echo x > "+mark); err != nil {
				t.Errorf("%s: writing the log directory inside: %v", door, err)
			} else if _, err := os.Stat(mark); err != nil {
				t.Errorf("%s: what the container wrote to %s is not on the host: %v", door, mark, err)
			}
		}

		// The annotation path.
		p := n.mustRunPod(t, "mps", annotation("app", "family=shared"))
		id := n.mustRun(t, p, "app")
		check("annotation", id)

		// The claims API, the container given the claim's CDI device by containerd.
		out, errs, err := n.Accel.CLI("prepare", "mps-claim", "--family", "shared", "--device", "shared0")
		if err != nil {
			t.Fatalf("prepare mps-claim: %v: %s", err, errs)
		}
		fields := strings.Fields(out)
		if len(fields) != 3 {
			t.Fatalf("prepare answered %q; want <pool> <device> <cdi ids>", out)
		}
		q := n.mustRunPod(t, "mps-cdi", nil)
		id2, err := n.CRI.CreateContainerAnnotated(q, "app", cdiAnnotation(fields[2]))
		if err == nil {
			err = n.CRI.StartContainer(id2)
		}
		if err != nil {
			t.Fatalf("container with CDI device %s: %v", fields[2], err)
		}
		check("claims-api", id2)
		n.assertNoDoubleGrant(t)
	})
}
