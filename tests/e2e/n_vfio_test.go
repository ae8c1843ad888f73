package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// vfioGroup is the stand-in IOMMU group of scenario n: two functions bound to vfio-pci.
const vfioGroup = 4242

// vfioMinor is the stand-in group node's minor (on a real host it is not the group number).
const vfioMinor = 100

// mkVfioSysfs writes a sysfs tree under root with IOMMU group vfioGroup of two functions
// (0000:f1:00.0, a GPU, and 0000:f1:00.1, its audio function) bound to vfio-pci; the group
// node's number is major:vfioMinor. Discovery reads only these files.
func mkVfioSysfs(t *testing.T, root string, major uint32) {
	t.Helper()
	write := func(p, text string) {
		p = filepath.Join(root, p)
		must(t, os.MkdirAll(filepath.Dir(p), 0o755))
		must(t, os.WriteFile(p, []byte(text), 0o644))
	}
	link := func(p, target string) {
		p = filepath.Join(root, p)
		must(t, os.MkdirAll(filepath.Dir(p), 0o755))
		must(t, os.Symlink(target, p))
	}
	for bdf, class := range map[string]string{"0000:f1:00.0": "0x030200", "0000:f1:00.1": "0x040300"} {
		d := "sys/bus/pci/devices/" + bdf
		write(d+"/class", class+"\n")
		write(d+"/vendor", "0x10de\n")
		write(d+"/device", "0x2331\n")
		write(d+"/numa_node", "-1\n")
		link(d+"/driver", "../../../../bus/pci/drivers/vfio-pci")
		link(d+"/iommu_group", fmt.Sprintf("../../../../kernel/iommu_groups/%d", vfioGroup))
		write(fmt.Sprintf("sys/kernel/iommu_groups/%d/devices/%s", vfioGroup, bdf), "")
	}
	write(fmt.Sprintf("sys/class/vfio/%d/dev", vfioGroup), fmt.Sprintf("%d:%d\n", major, vfioMinor))
	write("sys/class/misc/vfio/dev", "10:196\n")
}

// Scenario n: a VFIO passthrough group discovered from a stand-in sysfs tree, prepared through
// the claims API from a passthrough pool, and given to a container by containerd's own CDI
// injection: the container sees /dev/vfio/vfio (10:196) and /dev/vfio/<group> with the group
// node's major:minor, and the env naming the group's functions. A second prepare of the group
// is refused: a group has one holder.
func TestN_VfioGroupInContainerd(t *testing.T) {
	eachVersion(t, func(t *testing.T, v string) {
		if isCrio(v) {
			t.Skip("SKIPPED: scenario n is written for containerd's CDI injection")
		}
		n := startNode(t, v, modes(v)[0], NodeOptions{NoAccel: true})
		root := filepath.Join(n.Dir, "host")
		mkVfioSysfs(t, root, n.Devs.Major)
		cfg, err := os.ReadFile(n.Accel.Config)
		must(t, err)
		text := strings.Replace(string(cfg), "discovery:\n  sysfs: false\n",
			fmt.Sprintf("discovery:\n  root: %s\n  sysfs: true\n", root), 1)
		text += "  - name: vm\n    passthrough: true\n    select: { vendor: nvidia }\n    family: { kind: exclusive }\n"
		must(t, os.WriteFile(n.Accel.Config, []byte(text), 0o644))
		n.Accel.Start(t)

		out, errs, err := n.Accel.CLI("prepare", "vm1", "--device", "0000:f1:00.0")
		if err != nil {
			t.Fatalf("prepare vm1: %v: %s", err, errs)
		}
		fields := strings.Fields(out)
		if len(fields) != 3 || fields[0] != "vm" {
			t.Fatalf("prepare answered %q; want pool vm, the device and its CDI id", out)
		}
		if _, errs, err := n.Accel.CLI("prepare", "vm2", "--device", "0000:f1:00.0"); err == nil {
			t.Errorf("a second claim was given the group vm1 holds")
		} else if !strings.Contains(errs, "vm1") {
			t.Errorf("the refusal of a second holder does not name vm1: %s", errs)
		}

		p := n.mustRunPod(t, "vm", nil)
		id, err := n.CRI.CreateContainerAnnotated(p, "launcher", cdiAnnotation(fields[2]))
		if err == nil {
			err = n.CRI.StartContainer(id)
		}
		if err != nil {
			t.Fatalf("container with the group's CDI device %s: %v", fields[2], err)
		}
		for path, want := range map[string][2]int64{
			"/dev/vfio/vfio":                       {10, 196},
			fmt.Sprintf("/dev/vfio/%d", vfioGroup): {int64(n.Devs.Major), vfioMinor},
		} {
			view, err := n.viewDevice(t, id, path)
			if err != nil || view.Type != "character special file" || view.Major != want[0] || view.Minor != want[1] {
				t.Errorf("%s in the container: %+v %v; want a char device %d:%d", path, view, err, want[0], want[1])
			}
		}
		env, err := n.CRI.Exec(id, "env")
		must(t, err)
		wantEnv := fmt.Sprintf("ACCEL_VFIO_GROUP_%d=0000:f1:00.0,0000:f1:00.1", vfioGroup)
		if !strings.Contains(env, wantEnv) {
			t.Errorf("env in the container lacks %s:\n%s", wantEnv, env)
		}
		must(t, n.CRI.RemoveContainer(id))
		if out, errs, err := n.Accel.CLI("unprepare", "vm1"); err != nil {
			t.Fatalf("unprepare vm1: %v: %s %s", err, out, errs)
		}
	})
}
