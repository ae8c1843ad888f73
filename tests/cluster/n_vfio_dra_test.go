package cluster

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// withVfioGroupDRA adds scenario n's VFIO group as a static device and a passthrough pool
// `vm-gpus` taking it, for nri-accel's DRA driver.
func withVfioGroupDRA(t *testing.T, c *Cluster, config string) string {
	dev := fmt.Sprintf("    - id: %q\n      vendor: nvidia\n      model: GA102GL A10\n      pci_address: %q\n"+
		"      numa_node: 0\n      driver: vfio-pci\n      nodes:\n        - { path: /dev/vfio/%d, major: %d, minor: %d }\n"+
		"      control_nodes:\n        - { path: /dev/vfio/vfio, major: 10, minor: 196 }\n"+
		"      vfio: { group: %d, functions: [%q, %q] }\n",
		vfioPrimary, vfioPrimary, vfioGroup, c.Devs.Major, vfioMinor, vfioGroup, vfioPrimary, vfioSecondary)
	if !strings.Contains(config, "\npools:\n") {
		t.Fatalf("scenario n cannot place its device in this config:\n%s", config)
	}
	config = strings.Replace(config, "\npools:\n", "\n"+dev+"pools:\n", 1)
	return config + "  - name: vm-gpus\n    passthrough: true\n    select: { vendor: nvidia }\n    family: { kind: exclusive }\n"
}

// A DeviceClass selecting nri-accel's passthrough groups (docs/vms.md).
const passthroughClass = `apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: accel-gpu-passthrough}
spec:
  selectors:
    - cel:
        expression: device.driver == "accel.nri.io" && device.attributes["accel.nri.io"].type == "passthrough"
`

// Scenario n, KubeVirt on DRA (issue 36 item 2): a pod shaped like KubeVirt's virt-launcher for
// a VMI whose gpus entry names claim `gpu` (from a template) and request `gpu` gets a
// passthrough group from nri-accel's DRA driver. In its container, tests/metadata-reader reads
// the request's KEP-5304 file by KubeVirt's rules (the one `*-metadata.json` of
// resourceclaimtemplates/<claim>/<request>/, decoded with Kubernetes' own decoder) and its
// `resource.kubernetes.io/pciBusID` is the group's primary function, the address virt-launcher
// hands QEMU; the group's /dev/vfio/<group> and /dev/vfio/vfio are there, as virt-launcher opens
// them. KubeVirt's own modules cannot be fetched here, so its rules are the reader's checks.
func TestClusterVfioDRA(t *testing.T) {
	requireRoot(t)
	reader := buildMetadataReader(t)
	for _, v := range kubeVersions() {
		t.Run(v, func(t *testing.T) {
			c := Start(t, v, Options{EditConfig: withVfioGroupDRA, NoExclusiveCPUs: true})
			c.waitAccelReady(t)
			c.apply(passthroughClass)
			c.apply(claimTemplateYAML("vm-gpu", oneDevice("accel-gpu-passthrough", "", "")))
			// virt-launcher's shape: its compute container, the VMI's claim by the name the VMI
			// gives it, the reader mounted where the test can run it.
			launcher := strings.Replace(readerPodYAML("virt-launcher-vm1", reader, "", "vm-gpu"),
				"metadata: {name: virt-launcher-vm1, namespace: default}",
				"metadata: {name: virt-launcher-vm1, namespace: default, labels: {kubevirt.io: virt-launcher}}", 1)
			c.apply(launcher)
			c.waitRunning(t, "virt-launcher-vm1", 120*time.Second)
			d := c.readMetadata(t, "virt-launcher-vm1", "-pod-claim", "gpu", "-request", "gpu")
			if !strings.Contains(d.Path, "/resourceclaimtemplates/gpu/gpu/accel.nri.io-metadata.json") {
				t.Errorf("the metadata read from %s", d.Path)
			}
			if len(d.Requests) != 1 || len(d.Requests[0].Devices) != 1 {
				t.Fatalf("%s: requests %+v, want one device for request gpu", d.Path, d.Requests)
			}
			attrs := d.Requests[0].Devices[0].Attributes
			if bus := field(attrs, "resource.kubernetes.io/pciBusID", "string"); bus != vfioPrimary {
				t.Errorf("pciBusID %v, want the group's primary function %s (attributes %v)", bus, vfioPrimary, attrs)
			}
			if g := field(attrs, "iommuGroup", "int"); fmt.Sprint(g) != fmt.Sprint(vfioGroup) {
				t.Errorf("iommuGroup %v, want %d", g, vfioGroup)
			}
			checkMetadata(t, d, c.claimOfPod(t, c.pod("virt-launcher-vm1")), "gpu", c.publishedDevices(t))
			for path, want := range map[string]string{
				"/dev/vfio/vfio":                       "a:c4",
				fmt.Sprintf("/dev/vfio/%d", vfioGroup): fmt.Sprintf("%x:%x", c.Devs.Major, vfioMinor),
			} {
				got, err := c.ExecIn("default", "virt-launcher-vm1", "app", "stat", "-c", "%F %t:%T", path)
				if err != nil || strings.TrimSpace(got) != "character special file "+want {
					t.Errorf("%s in the launcher pod: %q %v; want a char device %s", path, got, err, want)
				}
			}
			t.Logf("virt-launcher's view: %s pciBusID %s, /dev/vfio/%d", d.Path, vfioPrimary, vfioGroup)
			c.deletePod(t, "virt-launcher-vm1")
		})
	}
}
