package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Scenario j, the shipped image: packaging/image.sh builds the image from the binary under test
// (no Docker, no registry), `ctr images import` loads it, and the runtime runs it as the shipped
// DaemonSet does (packaging/kubernetes/daemonset.yaml: `image: nri-accel:<version>`, root without
// capabilities, no privilege escalation, read-only root, the same host mounts at the same
// paths). The daemon inside connects to containerd's NRI socket, `status` (on the host and inside
// the container) shows the gate open, and a pod asking for a device by annotation gets it. The
// image's default (no args, its unprivileged user) prints the version.
func TestJ_ImageRunsAsTheDaemonSet(t *testing.T) {
	eachVersion(t, func(t *testing.T, v string) {
		if isCrio(v) {
			t.Skip("SKIPPED: the image scenario is written for containerd's ctr import; CRI-O is tested with nri-accel as an external plugin")
		}
		n := startNode(t, v, modes(v)[0], NodeOptions{NoAccel: true})
		ref := importAccelImage(t, n)

		// The image alone: its default user (65532) and command (--version).
		logs := filepath.Join(n.Dir, "pod-logs")
		must(t, os.MkdirAll(logs, 0o755))
		pod, err := n.CRI.RunPodLogged("image-version", logs)
		must(t, err)
		id, err := n.CRI.createFromImage(pod, "version", ref, imageContainer{LogPath: "version.log"})
		if err != nil {
			t.Fatalf("create a container of %s: %v", ref, err)
		}
		must(t, n.CRI.StartContainer(id))
		if !waitFor(30*time.Second, func() bool {
			st, err := n.CRI.ContainerState(id)
			return err == nil && st == cri.ContainerState_CONTAINER_EXITED
		}) {
			t.Fatalf("the image's default command did not exit within 30 s")
		}
		code, user, err := n.CRI.exitAndUser(id)
		must(t, err)
		if code != 0 || user != 65532 {
			t.Errorf("the image's default command: exit %d as uid %d, want 0 as 65532", code, user)
		}
		if out, _ := os.ReadFile(filepath.Join(logs, "version.log")); !strings.Contains(string(out), "nri-accel ") {
			t.Errorf("the image's default command printed no version: %q", out)
		}

		// The DaemonSet's container: its config with the DaemonSet's paths, the test's dirs
		// mounted where the DaemonSet mounts the host's.
		etc := filepath.Join(n.Accel.Dir, "etc")
		run := filepath.Join(n.Accel.Dir, "run")
		for _, d := range []string{etc, run, n.Accel.StateDir} {
			must(t, os.MkdirAll(d, 0o755))
		}
		cfg := "state_dir: /var/lib/nri-accel\nnri:\n  socket: /var/run/nri/nri.sock\n  cdi_injection: " + n.Mode +
			"\nclaims_api:\n  socket: /run/nri-accel/claims.sock\ncdi:\n  dir: /var/run/cdi\nreconcile_interval_secs: 0\n" +
			defaultLayout(t, 0).yaml(n.Devs)
		must(t, os.WriteFile(filepath.Join(etc, "config.yaml"), []byte(cfg), 0o644))
		ds := imageContainer{
			Args:    []string{"run", "--config", "/etc/nri-accel/config.yaml"},
			LogPath: "daemon.log",
			Root:    true,
			Mounts: []*cri.Mount{
				{HostPath: etc, ContainerPath: "/etc/nri-accel", Readonly: true},
				{HostPath: n.Accel.StateDir, ContainerPath: "/var/lib/nri-accel"},
				{HostPath: run, ContainerPath: "/run/nri-accel"},
				{HostPath: n.Accel.CDIDir, ContainerPath: "/var/run/cdi"},
				{HostPath: filepath.Dir(n.Ctd.NRISock), ContainerPath: "/var/run/nri"},
				{HostPath: "/sys", ContainerPath: "/sys", Readonly: true},
				{HostPath: "/dev", ContainerPath: "/dev", Readonly: true},
			},
		}
		dsPod, err := n.CRI.RunPodLogged("nri-accel", logs)
		must(t, err)
		daemon, err := n.CRI.createFromImage(dsPod, "nri-accel", ref, ds)
		if err != nil {
			t.Fatalf("create the DaemonSet's container: %v", err)
		}
		must(t, n.CRI.StartContainer(daemon))
		n.Accel.Log = filepath.Join(logs, ds.LogPath) // kept with the test's logs when it fails
		// The host's CLI reads the claims socket the container serves (same dir, the host's path).
		n.Accel.WaitGate(t)
		out, err := n.CRI.Exec(daemon, "/usr/bin/nri-accel", "status", "--json")
		var inside Status
		if err == nil {
			err = json.Unmarshal([]byte(out), &inside)
		}
		if err != nil || !inside.GateOpen() {
			t.Fatalf("status inside the container: gate not open (%v)\n%s", err, out)
		}
		if _, user, err := n.CRI.exitAndUser(daemon); err != nil || user != 0 {
			t.Errorf("the DaemonSet's container runs as uid %d (%v), want 0 as its securityContext says", user, err)
		}

		// A pod asking for a device by annotation gets it from the containerised daemon.
		p := n.mustRunPod(t, "user", annotation("app", exclusiveAsk))
		app := n.mustRun(t, p, "app")
		if out, err := n.CRI.Exec(app, "stat", "-c", "%F %t:%T", n.Devs.Path(0)); err != nil ||
			out != fmt.Sprintf("character special file %x:0\n", n.Devs.Major) {
			t.Fatalf("the grant of the daemon in the image did not reach the container: %q %v\n%s", out, err, tail(n.Accel.Log, 20))
		}
		if held := n.status(t).Held()["accel0"]; len(held) != 1 {
			t.Errorf("accel0 held by %v, want one claim", held)
		}
	})
}

// importAccelImage builds the image with packaging/image.sh from the binary under test (about
// 8 s), imports it into n's containerd and answers the ref a pod names (nri-accel:<version>).
func importAccelImage(t *testing.T, n *Node) string {
	t.Helper()
	dir := filepath.Join(n.Dir, "image")
	cmd := exec.Command("bash", filepath.Join(testsDir(), "..", "packaging", "image.sh"), accelBin(t), dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("packaging/image.sh failed: %v\n%s", err, out)
	}
	t.Logf("%s", out)
	matches, _ := filepath.Glob(filepath.Join(dir, "nri-accel-*-oci.tar"))
	if len(matches) != 1 {
		t.Fatalf("packaging/image.sh wrote no single archive in %s: %v", dir, matches)
	}
	version := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(matches[0]), "nri-accel-"), "-oci.tar")
	if out, err := n.Ctd.Ctr("images", "import", matches[0]); err != nil {
		t.Fatalf("ctr images import %s: %v\n%s", matches[0], err, out)
	}
	// A pod's `image: nri-accel:<version>` is this name once normalised: found without a registry.
	full := "docker.io/library/nri-accel:" + version
	if out, err := n.Ctd.Ctr("images", "ls", "-q"); err != nil || !strings.Contains(out, full) {
		t.Fatalf("imported image %s not listed: %v\n%s", full, err, out)
	}
	return "nri-accel:" + version
}

// imageContainer is how a container of the nri-accel image is run.
type imageContainer struct {
	Args    []string
	LogPath string
	Mounts  []*cri.Mount
	// Root runs it as the DaemonSet's securityContext does (runAsUser 0); else the image's user.
	Root bool
}

// createFromImage creates container `name` of image `ref` in pod with the DaemonSets' security
// context: no capabilities, no privilege escalation, read-only root.
func (c *CRI) createFromImage(pod *Pod, name, ref string, ic imageContainer) (string, error) {
	sc := &cri.LinuxContainerSecurityContext{
		NamespaceOptions: &cri.NamespaceOption{Network: cri.NamespaceMode_NODE, Pid: cri.NamespaceMode_CONTAINER},
		Capabilities:     &cri.Capability{DropCapabilities: []string{"ALL"}},
		NoNewPrivs:       true,
		ReadonlyRootfs:   true,
	}
	if ic.Root {
		sc.RunAsUser = &cri.Int64Value{Value: 0}
	}
	cfg := &cri.ContainerConfig{
		Metadata: &cri.ContainerMetadata{Name: name},
		Image:    &cri.ImageSpec{Image: ref, UserSpecifiedImage: ref},
		Args:     ic.Args,
		Mounts:   ic.Mounts,
		LogPath:  ic.LogPath,
		Labels: map[string]string{
			"io.kubernetes.container.name": name,
			"io.kubernetes.pod.name":       pod.Config.Metadata.Name,
			"io.kubernetes.pod.namespace":  pod.Config.Metadata.Namespace,
		},
		Linux: &cri.LinuxContainerConfig{SecurityContext: sc},
	}
	ctx, cancel := c.ctx()
	defer cancel()
	r, err := c.rt.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: pod.ID, Config: cfg, SandboxConfig: pod.Config})
	if err != nil {
		return "", err
	}
	return r.ContainerId, nil
}

// exitAndUser answers a container's exit code and the uid of its process (its OCI spec).
func (c *CRI) exitAndUser(id string) (int32, int64, error) {
	ctx, cancel := c.ctx()
	defer cancel()
	r, err := c.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: id, Verbose: true})
	if err != nil {
		return 0, 0, err
	}
	var info struct {
		RuntimeSpec struct {
			Process struct {
				User struct {
					UID int64 `json:"uid"`
				} `json:"user"`
			} `json:"process"`
		} `json:"runtimeSpec"`
	}
	if err := json.Unmarshal([]byte(r.Info["info"]), &info); err != nil {
		return 0, 0, fmt.Errorf("container %s: verbose info: %w", id, err)
	}
	return r.Status.ExitCode, info.RuntimeSpec.Process.User.UID, nil
}
