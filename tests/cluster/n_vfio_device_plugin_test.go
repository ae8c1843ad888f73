package cluster

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// The stand-in IOMMU group of scenario n: two functions, a GPU and its audio function, behind
// group node /dev/vfio/4242 (the fake devices' major, minor 100).
const (
	vfioGroup     = 4242
	vfioMinor     = 100
	vfioResource  = "nvidia.com/GA102GL_A10"
	vfioEnv       = "PCI_RESOURCE_NVIDIA_COM_GA102GL_A10"
	vfioPrimary   = "0000:f1:00.0"
	vfioSecondary = "0000:f1:00.1"
)

// withVfioGroup adds a VFIO group as a static device, a passthrough pool `vm-gpus` taking it,
// and the `vendor.com/model` resource name KubeVirt's permittedHostDevices would list for it.
func withVfioGroup(t *testing.T, c *Cluster, config string) string {
	dev := fmt.Sprintf("    - id: %q\n      vendor: nvidia\n      model: GA102GL A10\n      pci_address: %q\n"+
		"      driver: vfio-pci\n      nodes:\n        - { path: /dev/vfio/%d, major: %d, minor: %d }\n"+
		"      control_nodes:\n        - { path: /dev/vfio/vfio, major: 10, minor: 196 }\n"+
		"      vfio: { group: %d, functions: [%q, %q] }\n",
		vfioPrimary, vfioPrimary, vfioGroup, c.Devs.Major, vfioMinor, vfioGroup, vfioPrimary, vfioSecondary)
	if !strings.Contains(config, "\npools:\n") || !strings.Contains(config, "device_plugin:\n") {
		t.Fatalf("scenario n cannot place its device in this config:\n%s", config)
	}
	config = strings.Replace(config, "\npools:\n", "\n"+dev+"pools:\n", 1)
	config = strings.Replace(config, "device_plugin:\n",
		fmt.Sprintf("device_plugin:\n  resource_names: { vm-gpus: %s }\n", vfioResource), 1)
	return config + "  - name: vm-gpus\n    passthrough: true\n    select: { vendor: nvidia }\n    family: { kind: exclusive }\n"
}

// Scenario n: KubeVirt on device plugins. A passthrough pool served by the device plugin under
// a vendor.com/model resource name: a pod asking for it (as KubeVirt's virt-launcher pod does
// for a VMI's hostDevices) runs with PCI_RESOURCE_<NAME> set to the group's PCI address, the
// env KubeVirt's external providers set and virt-launcher reads, and with /dev/vfio/vfio and
// the group's /dev/vfio/<group> node.
func TestClusterVfioDevicePlugin(t *testing.T) {
	requireRoot(t)
	for _, v := range kubeVersions() {
		t.Run(v, func(t *testing.T) {
			c := Start(t, v, Options{DevicePlugin: true, NoDRA: true, EditConfig: withVfioGroup})
			if !waitFor(60*time.Second, func() bool { return c.allocatable(vfioResource) == 1 }) {
				t.Fatalf("node allocatable %s = %d, want 1", vfioResource, c.allocatable(vfioResource))
			}
			c.apply(dpPodYAML("n-launcher", vfioResource, 1))
			c.waitRunning(t, "n-launcher", 120*time.Second)
			env, err := c.ExecIn("default", "n-launcher", "app", "env")
			must(t, err)
			if want := vfioEnv + "=" + vfioPrimary; !strings.Contains(env, want+"\n") {
				t.Errorf("the pod's env lacks %s:\n%s", want, env)
			}
			for path, want := range map[string]string{
				"/dev/vfio/vfio":                       "a:c4",
				fmt.Sprintf("/dev/vfio/%d", vfioGroup): fmt.Sprintf("%x:%x", c.Devs.Major, vfioMinor),
			} {
				got, err := c.ExecIn("default", "n-launcher", "app", "stat", "-c", "%F %t:%T", path)
				if err != nil || strings.TrimSpace(got) != "character special file "+want {
					t.Errorf("%s in the pod: %q %v; want a char device %s", path, got, err, want)
				}
			}
		})
	}
}
