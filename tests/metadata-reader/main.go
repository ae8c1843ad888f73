// Command metadata-reader runs in a pod of the cluster suite (tests/cluster,
// TestClusterDeviceMetadata) and reads the KEP-5304 device metadata nri-accel mounted for one
// request of one claim with Kubernetes' own decoder (k8s.io/dynamic-resource-allocation's
// devicemetadata package, v0.37.2), as a workload or KubeVirt's virt-launcher would. It checks
// what the decoder does not (exactly one <driver>-metadata.json in the request's directory, the
// one named after the driver) and prints what it decoded as one JSON line, with the attributes
// in the ResourceSlice's typed form, for the test to compare with the ResourceSlice.
//
//	metadata-reader -driver accel.nri.io -claim <claim name> -request <request>
//	metadata-reader -driver accel.nri.io -pod-claim <pod's name for the claim> -request <request>
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/api/metadata"
	"k8s.io/dynamic-resource-allocation/devicemetadata"
)

// device is one decoded device as the test compares it.
type device struct {
	Driver     string                                 `json:"driver"`
	Pool       string                                 `json:"pool"`
	Name       string                                 `json:"name"`
	Attributes map[string]resourceapi.DeviceAttribute `json:"attributes"`
}

// request is one decoded request.
type request struct {
	Name    string   `json:"name"`
	Devices []device `json:"devices"`
}

// decoded is what the reader prints.
type decoded struct {
	Path         string    `json:"path"`
	Name         string    `json:"name"`
	Namespace    string    `json:"namespace"`
	UID          string    `json:"uid"`
	PodClaimName *string   `json:"podClaimName"`
	Requests     []request `json:"requests"`
}

func main() {
	driver := flag.String("driver", "", "DRA driver name")
	claim := flag.String("claim", "", "claim name, for a claim the pod names directly")
	podClaim := flag.String("pod-claim", "", "the pod's name for a claim made from a template")
	req := flag.String("request", "", "request name")
	flag.Parse()
	if *driver == "" || *req == "" || (*claim == "") == (*podClaim == "") {
		fail("usage: metadata-reader -driver D (-claim C | -pod-claim P) -request R")
	}

	var (
		path string
		dm   *metadata.DeviceMetadata
		err  error
	)
	if *claim != "" {
		path = metadata.ResourceClaimFilePath(*driver, *claim, *req)
		dm, err = devicemetadata.ReadResourceClaimMetadataWithDriverName(*driver, *claim, *req)
	} else {
		path = metadata.ResourceClaimTemplateFilePath(*driver, *podClaim, *req)
		dm, err = devicemetadata.ReadResourceClaimTemplateMetadataWithDriverName(*driver, *podClaim, *req)
	}
	if err != nil {
		fail("decoding %s: %v", path, err)
	}
	// Exactly one metadata file in the request's directory, and it is this driver's.
	files, err := filepath.Glob(filepath.Join(filepath.Dir(path), "*"+metadata.MetadataFileSuffix))
	if err != nil || len(files) != 1 || files[0] != path {
		fail("the request directory %s holds %v (error %v), want exactly %s", filepath.Dir(path), files, err, path)
	}
	// The directory reader (no driver name) agrees.
	var viaDir *metadata.DeviceMetadata
	if *claim != "" {
		viaDir, err = devicemetadata.ReadResourceClaimMetadata(*claim, *req)
	} else {
		viaDir, err = devicemetadata.ReadResourceClaimTemplateMetadata(*podClaim, *req)
	}
	if err != nil || len(viaDir.Requests) != len(dm.Requests) {
		fail("reading the request directory: %v (%d requests, the file has %d)", err, len(viaDir.Requests), len(dm.Requests))
	}

	out := decoded{
		Path:         path,
		Name:         dm.Name,
		Namespace:    dm.Namespace,
		UID:          string(dm.UID),
		PodClaimName: dm.PodClaimName,
	}
	for _, r := range dm.Requests {
		dr := request{Name: r.Name}
		for _, d := range r.Devices {
			attrs := map[string]resourceapi.DeviceAttribute{}
			for k, v := range d.Attributes {
				attrs[string(k)] = v
			}
			dr.Devices = append(dr.Devices, device{Driver: d.Driver, Pool: d.Pool, Name: d.Name, Attributes: attrs})
		}
		out.Requests = append(out.Requests, dr)
	}
	b, err := json.Marshal(out)
	if err != nil {
		fail("encoding: %v", err)
	}
	fmt.Println(string(b))
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "metadata-reader: "+format+"\n", args...)
	os.Exit(1)
}
