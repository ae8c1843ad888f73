package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// CRI is a CRI client on one containerd socket: one helper per call the kubelet makes.
type CRI struct {
	conn *grpc.ClientConn
	rt   cri.RuntimeServiceClient
	// Timeout bounds every call (a hung runtime must not hang the suite).
	Timeout time.Duration
}

func dialCRI(socket string) (*CRI, error) {
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	return &CRI{conn: conn, rt: cri.NewRuntimeServiceClient(conn), Timeout: 60 * time.Second}, nil
}

// Close closes the connection.
func (c *CRI) Close() { _ = c.conn.Close() }

func (c *CRI) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), c.Timeout)
}

// Ready answers nil once the runtime's CRI reports RuntimeReady.
func (c *CRI) Ready() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	st, err := c.rt.Status(ctx, &cri.StatusRequest{})
	if err != nil {
		return err
	}
	for _, cond := range st.GetStatus().GetConditions() {
		if cond.Type == cri.RuntimeReady && cond.Status {
			return nil
		}
	}
	return fmt.Errorf("runtime not ready: %v", st.GetStatus())
}

var podSeq atomic.Int64

// Pod is a running pod sandbox and the config it was created with.
type Pod struct {
	ID     string
	Config *cri.PodSandboxConfig
}

// RunPod runs a pod sandbox on the host network (no CNI) with these annotations.
func (c *CRI) RunPod(name string, annotations map[string]string) (*Pod, error) {
	return c.runPod(name, annotations, "")
}

// RunPodLogged is RunPod with the pod's log directory: its containers' LogPath is under it.
func (c *CRI) RunPodLogged(name, logDir string) (*Pod, error) {
	return c.runPod(name, nil, logDir)
}

func (c *CRI) runPod(name string, annotations map[string]string, logDir string) (*Pod, error) {
	n := podSeq.Add(1)
	cfg := &cri.PodSandboxConfig{
		Metadata: &cri.PodSandboxMetadata{
			Name: name, Namespace: "e2e", Uid: fmt.Sprintf("uid-%s-%d-%d", name, time.Now().UnixNano(), n),
		},
		Labels: map[string]string{
			"io.kubernetes.pod.name": name, "io.kubernetes.pod.namespace": "e2e",
		},
		Annotations:  annotations,
		LogDirectory: logDir,
		Linux: &cri.LinuxPodSandboxConfig{
			SecurityContext: &cri.LinuxSandboxSecurityContext{
				// As the kubelet sets them for a hostNetwork pod without shareProcessNamespace.
				NamespaceOptions: &cri.NamespaceOption{Network: cri.NamespaceMode_NODE, Pid: cri.NamespaceMode_CONTAINER},
			},
		},
	}
	ctx, cancel := c.ctx()
	defer cancel()
	r, err := c.rt.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: cfg})
	if err != nil {
		return nil, err
	}
	return &Pod{ID: r.PodSandboxId, Config: cfg}, nil
}

// CreateContainer creates container `name` in pod running the image's command.
func (c *CRI) CreateContainer(pod *Pod, name string) (string, error) {
	return c.CreateContainerAnnotated(pod, name, nil)
}

// CreateContainerAnnotated creates container `name` in pod with these container annotations.
func (c *CRI) CreateContainerAnnotated(pod *Pod, name string, annotations map[string]string) (string, error) {
	return c.createContainer(pod, name, annotations, nil)
}

// CreateContainerCommand creates container `name` in pod running command instead of the image's.
func (c *CRI) CreateContainerCommand(pod *Pod, name string, command []string) (string, error) {
	return c.createContainer(pod, name, nil, command)
}

func (c *CRI) createContainer(pod *Pod, name string, annotations map[string]string, command []string) (string, error) {
	cfg := &cri.ContainerConfig{
		Metadata:    &cri.ContainerMetadata{Name: name},
		Image:       &cri.ImageSpec{Image: imageRef, UserSpecifiedImage: imageRef},
		Command:     command,
		Annotations: annotations,
		Labels: map[string]string{
			"io.kubernetes.container.name": name,
			"io.kubernetes.pod.name":       pod.Config.Metadata.Name,
			"io.kubernetes.pod.namespace":  pod.Config.Metadata.Namespace,
		},
		Linux: &cri.LinuxContainerConfig{SecurityContext: &cri.LinuxContainerSecurityContext{
			NamespaceOptions: &cri.NamespaceOption{Network: cri.NamespaceMode_NODE, Pid: cri.NamespaceMode_CONTAINER},
		}},
	}
	ctx, cancel := c.ctx()
	defer cancel()
	r, err := c.rt.CreateContainer(ctx, &cri.CreateContainerRequest{PodSandboxId: pod.ID, Config: cfg, SandboxConfig: pod.Config})
	if err != nil {
		return "", err
	}
	return r.ContainerId, nil
}

// StartContainer starts a created container.
func (c *CRI) StartContainer(id string) error {
	ctx, cancel := c.ctx()
	defer cancel()
	_, err := c.rt.StartContainer(ctx, &cri.StartContainerRequest{ContainerId: id})
	return err
}

// Run creates and starts container `name` in pod.
func (c *CRI) Run(pod *Pod, name string) (string, error) {
	id, err := c.CreateContainer(pod, name)
	if err != nil {
		return "", err
	}
	return id, c.StartContainer(id)
}

// StopContainer stops a container at once (SIGKILL: the image's PID 1 ignores SIGTERM).
func (c *CRI) StopContainer(id string) error {
	ctx, cancel := c.ctx()
	defer cancel()
	_, err := c.rt.StopContainer(ctx, &cri.StopContainerRequest{ContainerId: id, Timeout: 0})
	return err
}

// RemoveContainer removes a container (stopping it first).
func (c *CRI) RemoveContainer(id string) error {
	if err := c.StopContainer(id); err != nil {
		return err
	}
	ctx, cancel := c.ctx()
	defer cancel()
	_, err := c.rt.RemoveContainer(ctx, &cri.RemoveContainerRequest{ContainerId: id})
	return err
}

// RemovePod stops and removes a pod sandbox with its containers. Its containers are stopped
// with SIGKILL first (CRI-O's StopPodSandbox would give them a grace period).
func (c *CRI) RemovePod(id string) error {
	ctx, cancel := c.ctx()
	defer cancel()
	list, err := c.rt.ListContainers(ctx, &cri.ListContainersRequest{Filter: &cri.ContainerFilter{PodSandboxId: id}})
	if err != nil {
		return err
	}
	for _, ctr := range list.Containers {
		if ctr.State == cri.ContainerState_CONTAINER_RUNNING {
			if _, err := c.rt.StopContainer(ctx, &cri.StopContainerRequest{ContainerId: ctr.Id, Timeout: 0}); err != nil {
				return err
			}
		}
	}
	if _, err := c.rt.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: id}); err != nil {
		return err
	}
	_, err = c.rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: id})
	return err
}

// Pods lists pod sandbox ids.
func (c *CRI) Pods() ([]string, error) {
	ctx, cancel := c.ctx()
	defer cancel()
	r, err := c.rt.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{})
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, p := range r.Items {
		ids = append(ids, p.Id)
	}
	return ids, nil
}

// Containers lists container ids of any state.
func (c *CRI) Containers() ([]*cri.Container, error) {
	ctx, cancel := c.ctx()
	defer cancel()
	r, err := c.rt.ListContainers(ctx, &cri.ListContainersRequest{})
	if err != nil {
		return nil, err
	}
	return r.Containers, nil
}

// Exec runs cmd in a running container and answers its stdout; a non-zero exit is an error
// carrying stderr.
func (c *CRI) Exec(id string, cmd ...string) (string, error) {
	ctx, cancel := c.ctx()
	defer cancel()
	r, err := c.rt.ExecSync(ctx, &cri.ExecSyncRequest{ContainerId: id, Cmd: cmd, Timeout: 30})
	if err != nil {
		return "", err
	}
	if r.ExitCode != 0 {
		return string(r.Stdout), fmt.Errorf("%q exited %d: %s", strings.Join(cmd, " "), r.ExitCode, r.Stderr)
	}
	return string(r.Stdout), nil
}

// Spec is the part of a container's OCI spec the scenarios check, as containerd stored it.
type Spec struct {
	Process struct {
		Env []string `json:"env"`
	} `json:"process"`
	Linux struct {
		Devices []struct {
			Path  string `json:"path"`
			Type  string `json:"type"`
			Major int64  `json:"major"`
			Minor int64  `json:"minor"`
		} `json:"devices"`
		Resources struct {
			CPU struct {
				Cpus string `json:"cpus"`
			} `json:"cpu"`
		} `json:"resources"`
	} `json:"linux"`
}

// ContainerSpec answers the OCI spec containerd made for a container (ContainerStatus verbose).
func (c *CRI) ContainerSpec(id string) (*Spec, error) {
	ctx, cancel := c.ctx()
	defer cancel()
	r, err := c.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: id, Verbose: true})
	if err != nil {
		return nil, err
	}
	var info struct {
		RuntimeSpec Spec `json:"runtimeSpec"`
	}
	if err := json.Unmarshal([]byte(r.Info["info"]), &info); err != nil {
		return nil, fmt.Errorf("container %s: verbose info: %w", id, err)
	}
	return &info.RuntimeSpec, nil
}

// ContainerState answers a container's state.
func (c *CRI) ContainerState(id string) (cri.ContainerState, error) {
	ctx, cancel := c.ctx()
	defer cancel()
	r, err := c.rt.ContainerStatus(ctx, &cri.ContainerStatusRequest{ContainerId: id})
	if err != nil {
		return 0, err
	}
	return r.Status.State, nil
}

// UpdateCPUs is the kubelet's UpdateContainerResources of a container's cpuset.
func (c *CRI) UpdateCPUs(id, cpus string) error {
	ctx, cancel := c.ctx()
	defer cancel()
	_, err := c.rt.UpdateContainerResources(ctx, &cri.UpdateContainerResourcesRequest{
		ContainerId: id, Linux: &cri.LinuxContainerResources{CpusetCpus: cpus},
	})
	return err
}
