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

	"go.yaml.in/yaml/v3"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Scenario j, the shipped image: packaging/image.sh builds the image from the binary under test
// (no Docker, no registry), `ctr images import` loads it, and the runtime runs the container of
// the shipped DaemonSet (packaging/kubernetes/daemonset.yaml, read by the test: its image
// `nri-accel:<version>`, args, securityContext and mounts, each hostPath on a test dir). The daemon inside connects to containerd's NRI socket, `status` (on the host and inside
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

		// The shipped DaemonSet's container (packaging/kubernetes/daemonset.yaml): its image, args,
		// securityContext and mounts, each hostPath put on a dir of this test. Its config is the
		// test's (DRA off: no API server here), with the paths the DaemonSet's config uses.
		shipped := shippedDaemonSet(t)
		if shipped.Image != ref {
			t.Errorf("the shipped DaemonSet runs image %s, the image built is %s", shipped.Image, ref)
		}
		etc := filepath.Join(n.Accel.Dir, "etc")
		run := filepath.Join(n.Accel.Dir, "run")
		for _, d := range []string{etc, run, n.Accel.StateDir} {
			must(t, os.MkdirAll(d, 0o755))
		}
		cfg := "state_dir: /var/lib/nri-accel\nnri:\n  socket: /var/run/nri/nri.sock\n  cdi_injection: " + n.Mode +
			"\nclaims_api:\n  socket: /run/nri-accel/claims.sock\ncdi:\n  dir: /var/run/cdi\nreconcile_interval_secs: 0\n" +
			defaultLayout(t, 0).yaml(n.Devs)
		must(t, os.WriteFile(filepath.Join(etc, "config.yaml"), []byte(cfg), 0o644))
		hostDirs := map[string]string{
			"/var/lib/nri-accel": n.Accel.StateDir,
			"/run/nri-accel":     run,
			"/var/run/cdi":       n.Accel.CDIDir,
			"/var/run/nri":       filepath.Dir(n.Ctd.NRISock),
			"/sys":               "/sys",
			"/dev":               "/dev",
		}
		ds := imageContainer{Args: shipped.Args, LogPath: "daemon.log", Security: shipped.Security}
		for _, m := range shipped.Mounts {
			host := etc
			if m.HostPath != "" {
				var ok bool
				if host, ok = hostDirs[m.HostPath]; !ok {
					// The kubelet's dirs: unused with DRA off, mounted from empty dirs.
					host = filepath.Join(n.Dir, "host", m.HostPath)
					must(t, os.MkdirAll(host, 0o755))
				}
			}
			ds.Mounts = append(ds.Mounts, &cri.Mount{HostPath: host, ContainerPath: m.Path, Readonly: m.ReadOnly})
		}
		t.Logf("the shipped DaemonSet's container: %s %v, %d mounts", shipped.Image, shipped.Args, len(ds.Mounts))
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
	// Security is the container's securityContext; the zero value runs the image's user with
	// no capabilities, no privilege escalation and a read-only root.
	Security securityContext
}

// securityContext is the part of a Kubernetes container securityContext the DaemonSets set.
type securityContext struct {
	RunAsUser                *int64 `yaml:"runAsUser"`
	AllowPrivilegeEscalation *bool  `yaml:"allowPrivilegeEscalation"`
	ReadOnlyRootFilesystem   *bool  `yaml:"readOnlyRootFilesystem"`
	Capabilities             struct {
		Drop []string `yaml:"drop"`
	} `yaml:"capabilities"`
}

// createFromImage creates container `name` of image `ref` in pod with ic's security context.
func (c *CRI) createFromImage(pod *Pod, name, ref string, ic imageContainer) (string, error) {
	k := ic.Security
	drop := k.Capabilities.Drop
	if drop == nil {
		drop = []string{"ALL"}
	}
	sc := &cri.LinuxContainerSecurityContext{
		NamespaceOptions: &cri.NamespaceOption{Network: cri.NamespaceMode_NODE, Pid: cri.NamespaceMode_CONTAINER},
		Capabilities:     &cri.Capability{DropCapabilities: drop},
		// As the kubelet maps them: no_new_privs unless escalation is allowed.
		NoNewPrivs:     k.AllowPrivilegeEscalation == nil || !*k.AllowPrivilegeEscalation,
		ReadonlyRootfs: k.ReadOnlyRootFilesystem == nil || *k.ReadOnlyRootFilesystem,
	}
	if k.RunAsUser != nil {
		sc.RunAsUser = &cri.Int64Value{Value: *k.RunAsUser}
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

// daemonSetSpec is what the suite runs of the shipped DaemonSet's nri-accel container.
type daemonSetSpec struct {
	Image    string
	Args     []string
	Security securityContext
	Mounts   []daemonSetMount
}

// daemonSetMount is one volumeMount; HostPath is its volume's hostPath ("" for the ConfigMap).
type daemonSetMount struct {
	Path, HostPath string
	ReadOnly       bool
}

// shippedDaemonSet reads the DaemonSet of packaging/kubernetes/daemonset.yaml.
func shippedDaemonSet(t *testing.T) daemonSetSpec {
	t.Helper()
	path := filepath.Join(testsDir(), "..", "packaging", "kubernetes", "daemonset.yaml")
	f, err := os.Open(path)
	must(t, err)
	defer f.Close()
	var ds struct {
		Kind string `yaml:"kind"`
		Spec struct {
			Template struct {
				Spec struct {
					Containers []struct {
						Name         string          `yaml:"name"`
						Image        string          `yaml:"image"`
						Args         []string        `yaml:"args"`
						Security     securityContext `yaml:"securityContext"`
						VolumeMounts []struct {
							Name      string `yaml:"name"`
							MountPath string `yaml:"mountPath"`
							ReadOnly  bool   `yaml:"readOnly"`
						} `yaml:"volumeMounts"`
					} `yaml:"containers"`
					Volumes []struct {
						Name     string `yaml:"name"`
						HostPath *struct {
							Path string `yaml:"path"`
						} `yaml:"hostPath"`
						ConfigMap *struct{} `yaml:"configMap"`
					} `yaml:"volumes"`
				} `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"spec"`
	}
	dec := yaml.NewDecoder(f)
	for {
		if err := dec.Decode(&ds); err != nil {
			t.Fatalf("%s: no DaemonSet: %v", path, err)
		}
		if ds.Kind == "DaemonSet" {
			break
		}
	}
	pod := ds.Spec.Template.Spec
	if len(pod.Containers) != 1 || pod.Containers[0].Name != "nri-accel" {
		t.Fatalf("%s: want one container nri-accel, have %d", path, len(pod.Containers))
	}
	c := pod.Containers[0]
	out := daemonSetSpec{Image: c.Image, Args: c.Args, Security: c.Security}
	for _, m := range c.VolumeMounts {
		found := false
		for _, v := range pod.Volumes {
			if v.Name != m.Name {
				continue
			}
			found = true
			switch {
			case v.HostPath != nil:
				out.Mounts = append(out.Mounts, daemonSetMount{Path: m.MountPath, HostPath: v.HostPath.Path, ReadOnly: m.ReadOnly})
			case v.ConfigMap != nil:
				out.Mounts = append(out.Mounts, daemonSetMount{Path: m.MountPath, ReadOnly: m.ReadOnly})
			default:
				t.Fatalf("%s: volume %s is neither a hostPath nor a configMap: teach the suite", path, v.Name)
			}
		}
		if !found {
			t.Fatalf("%s: mount %s names no volume", path, m.Name)
		}
	}
	return out
}
