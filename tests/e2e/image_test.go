package e2e

import (
	"testing"

	"nri-accel/tests/internal/ociimage"
)

// The suite's only image (nri-accel/tests/internal/ociimage): Debian's static busybox, the
// containers' image and the pod sandbox (pause) image; no registry exists.
const imageRef = ociimage.Ref

// imageArchive writes the image's OCI layout archive to dir and answers its path (for `ctr
// images import`).
func imageArchive(t *testing.T, dir string) string { return ociimage.Archive(t, dir) }

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
