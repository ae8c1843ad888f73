// Command nvidia-oracle is the NVIDIA side of the vendor-CDI scenarios (tests/README.md, "The
// NVIDIA Container Toolkit as oracle"): it generates NVIDIA's CDI spec with the NVIDIA Container
// Toolkit's own generation library (pkg/nvcdi) over go-nvml's mock of a DGX A100 and a fixture
// driver root, and it applies a CDI spec to an OCI spec with the Go CDI library, so that the
// suite can compare what nri-accel gave a container with what the reference implementation
// would give it. The toolkit's hook, nvidia-cdi-hook, is built from the same module version
// (the `tool` line of go.mod), so the spec and the hook it names always match.
//
//	nvidia-oracle generate --driver-root D --dev-root R --hook H --out FILE [--gpus N]
//	nvidia-oracle apply --spec-dir DIR --device nvidia.com/gpu=0 [--device ...] < oci.json > oci.json
//	nvidia-oracle version
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	mockserver "github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
	"github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi"
	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

// DriverVersion is the driver version go-nvml's DGX A100 mock reports: the fixture's library
// names carry it (libcuda.so.<version>).
const DriverVersion = "550.54.15"

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "generate":
		err = generate(os.Args[2:])
	case "apply":
		err = apply(os.Args[2:], os.Stdin, os.Stdout)
	case "version":
		err = version()
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "nvidia-oracle %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: nvidia-oracle generate|apply|version [flags] (see the package comment)")
	os.Exit(2)
}

// generate writes NVIDIA's CDI spec for the mock server's GPUs, as `nvidia-ctk cdi generate`
// would with these roots: devices named by index and UUID, the common edits (control nodes,
// driver libraries, binaries, firmware, hooks).
func generate(args []string) error {
	fs := flag.NewFlagSet("generate", flag.ExitOnError)
	driverRoot := fs.String("driver-root", "", "the fixture driver root (libraries, binaries, firmware)")
	devRoot := fs.String("dev-root", "", "the root under which dev/nvidia* are (default the driver root)")
	hook := fs.String("hook", "", "the path of nvidia-cdi-hook the spec's hooks name")
	out := fs.String("out", "", "the spec file to write (.yaml or .json)")
	gpus := fs.Int("gpus", 8, "how many of the mock's 8 GPUs the node has")
	inventory := fs.String("inventory", "", "a JSON file to write the mock's GPUs to (index, UUID, PCI address, model)")
	_ = fs.Parse(args)
	if *driverRoot == "" || *hook == "" || *out == "" {
		return fmt.Errorf("--driver-root, --hook and --out are required")
	}
	if *devRoot == "" {
		*devRoot = *driverRoot
	}
	server := mockServer(*gpus)
	lib, err := nvcdi.New(
		nvcdi.WithMode(nvcdi.ModeNvml),
		nvcdi.WithNvmlLib(server),
		nvcdi.WithDriverRoot(*driverRoot),
		nvcdi.WithDevRoot(*devRoot),
		nvcdi.WithNVIDIACDIHookPath(*hook),
		nvcdi.WithDeviceNamers(mustNamer("index"), mustNamer("uuid")),
	)
	if err != nil {
		return fmt.Errorf("the toolkit's CDI library: %w", err)
	}
	s, err := lib.GetSpec("all")
	if err != nil {
		return fmt.Errorf("generating the spec: %w", err)
	}
	if err := s.Save(*out); err != nil {
		return fmt.Errorf("saving %s: %w", *out, err)
	}
	if *inventory != "" {
		return writeInventory(server, *inventory)
	}
	return nil
}

// GPU is one of the mock's GPUs as the suite lists it in nri-accel's static inventory.
type GPU struct {
	Index int `json:"index"`
	// Minor is the minor of its /dev/nvidia<minor>.
	Minor int    `json:"minor"`
	UUID  string `json:"uuid"`
	// PCIAddress is the GPU's address as the kernel writes it (dddd:bb:dd.f).
	PCIAddress string `json:"pci_address"`
	Model      string `json:"model"`
}

// writeInventory writes the mock's GPUs (what the spec describes) to path as JSON.
func writeInventory(server *mockserver.Server, path string) error {
	var gpus []GPU
	for i, d := range server.Devices {
		dev := d.(*mockserver.Device)
		bus := strings.ToLower(dev.PciBusID)
		// NVML writes an 8-digit domain (00000000:07:00.0); the kernel 4 digits.
		if len(bus) == 16 {
			bus = bus[4:]
		}
		gpus = append(gpus, GPU{Index: i, Minor: dev.Minor, UUID: dev.UUID, PCIAddress: bus, Model: dev.Config.Name})
	}
	b, err := json.MarshalIndent(gpus, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

func mustNamer(strategy string) nvcdi.DeviceNamer {
	n, err := nvcdi.NewDeviceNamer(strategy)
	if err != nil {
		panic(err)
	}
	return n
}

// mockServer is go-nvml's DGX A100 with the calls its mock leaves unset answered as a real
// server without MIG answers them, cut to n GPUs. Each call makes new GPU UUIDs.
func mockServer(n int) *mockserver.Server {
	s := dgxa100.New()
	if n > 0 && n < len(s.Devices) {
		s.Devices = s.Devices[:n]
		s.DeviceGetCountFunc = func() (int, nvml.Return) { return n, nvml.SUCCESS }
	}
	for i, d := range s.Devices {
		dev := d.(*mockserver.Device)
		dev.IsMigDeviceHandleFunc = func() (bool, nvml.Return) { return false, nvml.SUCCESS }
		dev.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return 0, nvml.SUCCESS }
		dev.GetIndexFunc = func() (int, nvml.Return) { return i, nvml.SUCCESS }
		dev.GetUUIDFunc = func() (string, nvml.Return) { return dev.UUID, nvml.SUCCESS }
	}
	return s
}

// apply reads an OCI spec, injects the named CDI devices from the specs in the given dirs with
// the Go CDI library (what a runtime's CDI support does) and writes the result.
func apply(args []string, in io.Reader, out io.Writer) error {
	fs := flag.NewFlagSet("apply", flag.ExitOnError)
	var dirs, devices list
	fs.Var(&dirs, "spec-dir", "a CDI spec dir (repeatable)")
	fs.Var(&devices, "device", "a qualified CDI device name (repeatable)")
	_ = fs.Parse(args)
	cache, err := cdi.NewCache(cdi.WithSpecDirs(dirs...), cdi.WithAutoRefresh(false))
	if err != nil {
		return fmt.Errorf("reading CDI specs from %v: %w", dirs, err)
	}
	if errs := cache.GetErrors(); len(errs) > 0 {
		return fmt.Errorf("CDI specs in %v: %v", dirs, errs)
	}
	var s oci.Spec
	if err := json.NewDecoder(in).Decode(&s); err != nil {
		return fmt.Errorf("reading the OCI spec: %w", err)
	}
	if unresolved, err := cache.InjectDevices(&s, devices...); err != nil {
		return fmt.Errorf("injecting %v (unresolved %v): %w", devices, unresolved, err)
	}
	enc := json.NewEncoder(out)
	enc.SetIndent("", " ")
	return enc.Encode(&s)
}

// version prints the toolkit's, go-nvml's and the CDI library's module versions in this build.
func version() error {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return fmt.Errorf("no build info")
	}
	for _, m := range bi.Deps {
		if strings.HasPrefix(m.Path, "github.com/NVIDIA/") || strings.HasPrefix(m.Path, "tags.cncf.io/") {
			fmt.Printf("%s %s\n", m.Path, m.Version)
		}
	}
	return nil
}

// list is a repeatable string flag.
type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }
