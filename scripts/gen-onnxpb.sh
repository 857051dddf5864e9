#!/usr/bin/env bash
# Regenerates model/onnxpb/onnx.pb.go: the ONNX protobuf schema (onnx.proto) as Go types, compiled by
# protoc with the official Go generator (google.golang.org/protobuf's protoc-gen-go), so the tests and
# tools/onnx-fp16 edit ONNX graphs with the maintained protobuf runtime rather than a hand-written
# encoder. The schema comes from Debian's python3-onnx (onnx 1.12, IR version 8); fields a newer graph
# carries survive a read-write round trip as unknown fields. Not part of the build: the generated file is
# committed. Needs protoc (Debian's protobuf-compiler) and python3-onnx; installs both when it may.
set -euo pipefail
cd "$(dirname "$0")/.."
proto=${ONNX_PROTO:-/usr/lib/python3/dist-packages/onnx/onnx.proto}
if ! command -v protoc >/dev/null || [[ ! -f $proto ]]; then
	apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q protobuf-compiler python3-onnx >/dev/null
fi
version=$(go list -m -f '{{.Version}}' google.golang.org/protobuf)
bin=$PWD/.deps/bin
GOBIN=$bin go install "google.golang.org/protobuf/cmd/protoc-gen-go@$version"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$proto" "$work/onnx.proto"
PATH=$bin:$PATH protoc -I "$work" --go_out="$work" \
	--go_opt=Monnx.proto=github.com/scorer/scorer/model/onnxpb --go_opt=paths=source_relative "$work/onnx.proto"
mv "$work/onnx.pb.go" model/onnxpb/onnx.pb.go
echo "gen-onnxpb: wrote model/onnxpb/onnx.pb.go from $proto (protoc-gen-go $version)"
