// Package ociimage writes the suites' only image: an OCI image layout archive of Debian's static
// busybox, which is both the containers' image and the pod sandbox (pause) image (no registry
// exists in the sandbox). Shared by the end-to-end suite (e2e) and the cluster suite (cluster).
package ociimage

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// The suite's only image: Debian's static busybox. It is the containers' image and the pod
// sandbox (pause) image; no registry exists.
const Ref = "e2e.local/nri-accel/busybox:1"

// The busybox applets the scenarios run, linked to /bin/busybox in the image.
var Applets = []string{"sh", "sleep", "cat", "ls", "stat", "env", "grep", "true", "echo", "head", "awk", "sed", "test", "printf"}

// Archive writes an OCI image layout archive of busybox-static to dir and answers its path
// (for `ctr images import`).
func Archive(t testing.TB, dir string) string {
	t.Helper()
	busybox, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Fatalf("no /bin/busybox (apt-get install busybox-static; tests/peers/build.sh does): %v", err)
	}
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	for _, d := range []string{"bin/", "dev/", "etc/", "proc/", "sys/", "tmp/"} {
		must(t, tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755}))
	}
	must(t, tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "bin/busybox", Mode: 0o755, Size: int64(len(busybox))}))
	_, err = tw.Write(busybox)
	must(t, err)
	for _, a := range Applets {
		must(t, tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + a, Linkname: "busybox", Mode: 0o777}))
	}
	must(t, tw.Close())

	blobs := map[string][]byte{}
	add := func(b []byte) string {
		d := fmt.Sprintf("sha256:%x", sha256.Sum256(b))
		blobs[d] = b
		return d
	}
	layerDigest := add(layer.Bytes())
	config, _ := json.Marshal(map[string]any{
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"config": map[string]any{
			"Env": []string{"PATH=/bin"},
			// PID 1 ignores SIGTERM: the suite stops containers with SIGKILL (timeout 0).
			"Cmd": []string{"/bin/sleep", "1000000"},
		},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{layerDigest}},
	})
	configDigest := add(config)
	manifest, _ := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        map[string]any{"mediaType": "application/vnd.oci.image.config.v1+json", "digest": configDigest, "size": len(config)},
		"layers":        []any{map[string]any{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layerDigest, "size": layer.Len()}},
	})
	manifestDigest := add(manifest)
	index, _ := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.index.v1+json",
		"manifests": []any{map[string]any{
			"mediaType": "application/vnd.oci.image.manifest.v1+json",
			"digest":    manifestDigest,
			"size":      len(manifest),
			"platform":  map[string]any{"architecture": runtime.GOARCH, "os": "linux"},
			"annotations": map[string]string{
				"io.containerd.image.name":          Ref,
				"org.opencontainers.image.ref.name": "1",
			},
		}},
	})

	path := filepath.Join(dir, "busybox-oci.tar")
	f, err := os.Create(path)
	must(t, err)
	defer f.Close()
	out := tar.NewWriter(f)
	file := func(name string, b []byte) {
		must(t, out.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(b))}))
		_, err := out.Write(b)
		must(t, err)
	}
	file("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`))
	file("index.json", index)
	must(t, out.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "blobs/", Mode: 0o755}))
	must(t, out.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "blobs/sha256/", Mode: 0o755}))
	for d, b := range blobs {
		file("blobs/sha256/"+d[len("sha256:"):], b)
	}
	must(t, out.Close())
	return path
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
