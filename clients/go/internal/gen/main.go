// Command gen generates the Go code of nri-accel's claims API (package claimsv1) from
// plugin/proto/claims.proto without protoc: it parses the proto with protocompile (pure Go),
// builds the CodeGeneratorRequest protoc would send, and runs the two protoc plugins
// (protoc-gen-go and containerd's protoc-gen-go-ttrpc, built by generate.sh at the versions
// pinned in this module's go.mod) over it, writing the files they answer.
//
// The proto has no go_package option (the Rust build does not need one), so the Go import
// path is given to both plugins as an M mapping; field numbers and the wire are untouched.
//
// Usage: gen -proto-dir DIR -proto FILE -go-package IMPORTPATH;NAME -out DIR PLUGIN...
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/bufbuild/protocompile"
	"github.com/bufbuild/protocompile/linker"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/pluginpb"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "gen: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	protoDir := flag.String("proto-dir", "", "directory the proto file is named relative to")
	protoFile := flag.String("proto", "", "proto file, relative to -proto-dir")
	goPackage := flag.String("go-package", "", "Go import path and package name, IMPORTPATH;NAME")
	outDir := flag.String("out", "", "directory the generated files are written under (by source-relative path)")
	flag.Parse()
	if *protoDir == "" || *protoFile == "" || *goPackage == "" || *outDir == "" || flag.NArg() == 0 {
		return fmt.Errorf("usage: gen -proto-dir DIR -proto FILE -go-package 'IMPORTPATH;NAME' -out DIR PLUGIN...")
	}

	files, err := compile(*protoDir, *protoFile)
	if err != nil {
		return err
	}
	// paths=source_relative: the files land in -out under the proto's own name (claims.pb.go).
	param := "paths=source_relative,M" + *protoFile + "=" + *goPackage
	req := &pluginpb.CodeGeneratorRequest{
		FileToGenerate: []string{*protoFile},
		Parameter:      proto.String(param),
		ProtoFile:      files,
	}
	for _, plugin := range flag.Args() {
		if err := runPlugin(plugin, req, *outDir); err != nil {
			return err
		}
	}
	return nil
}

// compile parses and links the proto (and anything it imports) and returns the descriptors in
// dependency order, with source info so the generated code keeps the proto's comments.
func compile(dir, file string) ([]*descriptorpb.FileDescriptorProto, error) {
	compiler := protocompile.Compiler{
		Resolver: protocompile.WithStandardImports(&protocompile.SourceResolver{
			ImportPaths: []string{dir},
		}),
		SourceInfoMode: protocompile.SourceInfoStandard,
	}
	linked, err := compiler.Compile(context.Background(), file)
	if err != nil {
		return nil, fmt.Errorf("%s could not be compiled: %w", filepath.Join(dir, file), err)
	}
	var out []*descriptorpb.FileDescriptorProto
	seen := map[string]bool{}
	var add func(f protoreflect.FileDescriptor)
	add = func(f protoreflect.FileDescriptor) {
		if seen[f.Path()] {
			return
		}
		seen[f.Path()] = true
		imports := f.Imports()
		for i := 0; i < imports.Len(); i++ {
			add(imports.Get(i).FileDescriptor)
		}
		if res, ok := f.(linker.Result); ok {
			out = append(out, res.FileDescriptorProto())
		} else {
			out = append(out, protodesc.ToFileDescriptorProto(f))
		}
	}
	for _, f := range linked {
		add(f)
	}
	return out, nil
}

// runPlugin runs one protoc plugin over the request and writes the files it answers.
func runPlugin(plugin string, req *pluginpb.CodeGeneratorRequest, outDir string) error {
	in, err := proto.Marshal(req)
	if err != nil {
		return fmt.Errorf("the CodeGeneratorRequest could not be encoded: %w", err)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(plugin)
	cmd.Stdin = bytes.NewReader(in)
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("plugin %s failed: %w: %s", plugin, err, strings.TrimSpace(stderr.String()))
	}
	var resp pluginpb.CodeGeneratorResponse
	if err := proto.Unmarshal(stdout.Bytes(), &resp); err != nil {
		return fmt.Errorf("plugin %s answered something that is not a CodeGeneratorResponse: %w", plugin, err)
	}
	if resp.Error != nil {
		return fmt.Errorf("plugin %s refused the proto: %s", plugin, resp.GetError())
	}
	for _, f := range resp.File {
		if f.GetInsertionPoint() != "" {
			return fmt.Errorf("plugin %s asked for an insertion point in %s, which gen does not support", plugin, f.GetName())
		}
		path := filepath.Join(outDir, filepath.FromSlash(f.GetName()))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(path, []byte(f.GetContent()), 0o644); err != nil {
			return err
		}
	}
	return nil
}
