package cluster

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// Scenario m, KEP-5304 device metadata read by Kubernetes' own decoder: a pod with a claim it
// names (resourceClaimName) and a pod with a claim from a template each run
// tests/metadata-reader (built with k8s.io/dynamic-resource-allocation v0.37.2's devicemetadata
// package, statically, and mounted into the pod from the host) inside their container. The
// reader decodes the file nri-accel mounted at the upstream path and checks that it is the only
// metadata file of its request's directory; the test compares what it decoded with the claim
// (name, namespace, UID, the pod's name for a template's claim, the allocated devices) and with
// the ResourceSlice (every attribute of each device, the standard pciBusID included). Once the
// pods are gone the claims' metadata is gone from the host. On 1.36+ a second cluster with
// DRAListTypeAttributes on publishes the standard NUMA node as a list, which the file carries as
// the slice does (`ints`) and the reader decodes.
func TestClusterDeviceMetadata(t *testing.T) {
	requireRoot(t)
	reader := buildMetadataReader(t)
	for _, v := range kubeVersions() {
		t.Run(v, func(t *testing.T) {
			c := Start(t, v, Options{WholeDevices: 2, NoExclusiveCPUs: true, PCIAddresses: true})
			c.waitAccelReady(t)
			deviceMetadata(t, c, reader)
		})
		var major, minor int
		fmt.Sscanf(v, "v%d.%d", &major, &minor)
		if minor < 36 {
			continue
		}
		// The standard NUMA node as a list (KEP-6072's ints): the reader's types decode it too.
		t.Run(v+"/DRAListTypeAttributes", func(t *testing.T) {
			c := Start(t, v, Options{WholeDevices: 2, NoExclusiveCPUs: true, PCIAddresses: true,
				ExtraGates: []string{"DRAListTypeAttributes"}})
			c.waitAccelReady(t)
			st, err := c.AccelStatus()
			must(t, err)
			if form := str(st, "kubernetes", "resource_slices", "numa_node_attribute"); form != "list" {
				t.Fatalf("numa_node_attribute %q with DRAListTypeAttributes on", form)
			}
			deviceMetadata(t, c, reader)
		})
	}
}

// buildMetadataReader builds tests/metadata-reader (a module of its own; go's build cache keeps
// it warm) statically into a dir of its own and answers that dir.
func buildMetadataReader(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	must(t, err)
	dir := t.TempDir()
	begin := time.Now()
	cmd := exec.Command(goBin, "build", "-o", filepath.Join(dir, "metadata-reader"), ".")
	cmd.Dir = filepath.Join(testsDir(), "metadata-reader")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build tests/metadata-reader: %v\n%s", err, b)
	}
	t.Logf("tests/metadata-reader built in %.1f s", time.Since(begin).Seconds())
	return dir
}

// readerPodYAML is podYAML with the reader's dir mounted at /reader and claim `gpu` either the
// named claim or one from template.
func readerPodYAML(name, readerDir, claim, template string) string {
	y := podYAML(name, template)
	if claim != "" {
		y = strings.Replace(y, "resourceClaimTemplateName: "+template, "resourceClaimName: "+claim, 1)
	}
	y = strings.Replace(y, "  containers:\n",
		"  volumes:\n    - {name: reader, hostPath: {path: "+readerDir+", type: Directory}}\n  containers:\n", 1)
	return y + "      volumeMounts: [{name: reader, mountPath: /reader, readOnly: true}]\n"
}

// decodedMetadata is what tests/metadata-reader prints.
type decodedMetadata struct {
	Path         string  `json:"path"`
	Name         string  `json:"name"`
	Namespace    string  `json:"namespace"`
	UID          string  `json:"uid"`
	PodClaimName *string `json:"podClaimName"`
	Requests     []struct {
		Name    string `json:"name"`
		Devices []struct {
			Driver     string         `json:"driver"`
			Pool       string         `json:"pool"`
			Name       string         `json:"name"`
			Attributes map[string]any `json:"attributes"`
		} `json:"devices"`
	} `json:"requests"`
}

// readMetadata runs the reader in pod's container with args and decodes its answer.
func (c *Cluster) readMetadata(t *testing.T, pod string, args ...string) decodedMetadata {
	t.Helper()
	out, err := c.ExecIn("default", pod, "app", append([]string{"/reader/metadata-reader", "-driver", "accel.nri.io"}, args...)...)
	if err != nil {
		ls, _ := c.ExecIn("default", pod, "app", "ls", "-lR", "/var/run/kubernetes.io")
		t.Fatalf("metadata-reader in pod %s: %v\n%s\nin the container:\n%s\nnri-accel:\n%s", pod, err, out, ls, tail(c.accelLog(), 20))
	}
	var d decodedMetadata
	if err := json.Unmarshal([]byte(out), &d); err != nil {
		t.Fatalf("metadata-reader printed %q: %v", out, err)
	}
	return d
}

// checkMetadata compares what the reader decoded with the claim and the published devices.
func checkMetadata(t *testing.T, d decodedMetadata, claim obj, podClaimName string, published map[string]obj) {
	t.Helper()
	name, uid := str(claim, "metadata", "name"), str(claim, "metadata", "uid")
	if d.Name != name || d.Namespace != "default" || d.UID != uid {
		t.Errorf("%s names claim %s/%s (%s), want default/%s (%s)", d.Path, d.Namespace, d.Name, d.UID, name, uid)
	}
	switch {
	case podClaimName == "" && d.PodClaimName != nil:
		t.Errorf("%s: podClaimName %q for a claim the pod names directly", d.Path, *d.PodClaimName)
	case podClaimName != "" && (d.PodClaimName == nil || *d.PodClaimName != podClaimName):
		t.Errorf("%s: podClaimName %v, want %q", d.Path, d.PodClaimName, podClaimName)
	}
	if len(d.Requests) != 1 || d.Requests[0].Name != "gpu" {
		t.Fatalf("%s: requests %+v, want the one request gpu", d.Path, d.Requests)
	}
	var got []string
	for _, dev := range d.Requests[0].Devices {
		got = append(got, dev.Driver+"/"+dev.Pool+"/"+dev.Name)
		want := published[dev.Name]
		if want == nil {
			t.Errorf("%s: device %s is not in the ResourceSlices", d.Path, dev.Name)
			continue
		}
		attrs, _ := want["attributes"].(map[string]any)
		if !reflect.DeepEqual(dev.Attributes, attrs) {
			t.Errorf("%s: device %s's attributes\n%v\ndiffer from its ResourceSlice's\n%v", d.Path, dev.Name, dev.Attributes, attrs)
		}
		if numa := field(attrs, "resource.kubernetes.io/numaNode"); numa == nil {
			t.Errorf("device %s publishes no standard numaNode", dev.Name)
		}
		bus := field(attrs, "resource.kubernetes.io/pciBusID", "string")
		if bus == nil || bus != field(attrs, "pciAddress", "string") {
			t.Errorf("device %s publishes pciBusID %v, pciAddress %v", dev.Name, bus, field(attrs, "pciAddress"))
		}
	}
	if alloc := allocatedDevices(claim); !reflect.DeepEqual(got, alloc) {
		t.Errorf("%s lists %v, the claim's allocation %v", d.Path, got, alloc)
	}
}

func deviceMetadata(t *testing.T, c *Cluster, reader string) {
	start := time.Now()
	c.apply(claimYAML("m-claim", oneDevice("accel-gpu", "", "")))
	c.apply(claimTemplateYAML("m-tmpl", oneDevice("accel-gpu", "", "")))
	c.apply(readerPodYAML("m-direct", reader, "m-claim", "x"))
	c.apply(readerPodYAML("m-template", reader, "", "m-tmpl"))
	c.waitRunning(t, "m-direct", 120*time.Second)
	c.waitRunning(t, "m-template", 120*time.Second)
	published := c.publishedDevices(t)

	direct := c.getJSON(t, "get", "resourceclaim", "m-claim", "-n", "default")
	d := c.readMetadata(t, "m-direct", "-claim", "m-claim", "-request", "gpu")
	checkMetadata(t, d, direct, "", published)
	t.Logf("the named claim's metadata at %s: %+v", d.Path, d)

	generated := c.claimOfPod(t, c.pod("m-template"))
	d = c.readMetadata(t, "m-template", "-pod-claim", "gpu", "-request", "gpu")
	checkMetadata(t, d, generated, "gpu", published)
	if !strings.Contains(d.Path, "/resourceclaimtemplates/gpu/gpu/") {
		t.Errorf("a template's claim read from %s", d.Path)
	}

	// On the host: one directory per prepared claim, gone with the pods.
	md := filepath.Join(c.KubeletDir, "plugins", "accel.nri.io", "dra-device-metadata")
	for _, uid := range []string{str(direct, "metadata", "uid"), str(generated, "metadata", "uid")} {
		if _, err := os.Stat(filepath.Join(md, uid)); err != nil {
			t.Errorf("claim %s's metadata on the host: %v", uid, err)
		}
	}
	c.deletePod(t, "m-direct")
	c.deletePod(t, "m-template")
	if !waitFor(60*time.Second, func() bool {
		entries, err := os.ReadDir(md)
		return err == nil && len(entries) == 0
	}) {
		entries, _ := os.ReadDir(md)
		t.Errorf("after the pods went %s still holds %v", md, entries)
	}
	c.kubectl("delete", "resourceclaim", "m-claim", "-n", "default")
	t.Logf("scenario m took %.1f s", time.Since(start).Seconds())
}
