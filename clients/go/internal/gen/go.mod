module nri-accel/clients/go/internal/gen

go 1.24.0

require (
	github.com/bufbuild/protocompile v0.14.1
	google.golang.org/protobuf v1.36.11
)

require (
	github.com/containerd/ttrpc v1.2.7 // indirect
	golang.org/x/sync v0.8.0 // indirect
)

tool (
	github.com/containerd/ttrpc/cmd/protoc-gen-go-ttrpc
	google.golang.org/protobuf/cmd/protoc-gen-go
)
