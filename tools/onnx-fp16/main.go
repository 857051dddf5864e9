// Command onnx-fp16 writes the float16 twin of a float32 ONNX graph
// (internal/onnxfp16): `make gpu-proof` runs it on the GPU host to make the
// fp16 variant of a production-size export. For a real model, prefer
// Optimum's own export (`optimum-cli export onnx --device cuda --dtype fp16`).
//
//	onnx-fp16 [--keep-io-types] IN.onnx OUT.onnx
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/scorer/scorer/internal/onnxfp16"
)

func main() {
	keep := flag.Bool("keep-io-types", false, "keep float32 graph inputs and outputs around the float16 body (default: float16 logits, as Optimum's fp16 export)")
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: onnx-fp16 [--keep-io-types] IN.onnx OUT.onnx")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() != 2 {
		flag.Usage()
		os.Exit(2)
	}
	st, err := onnxfp16.ConvertFile(flag.Arg(0), flag.Arg(1), onnxfp16.Options{KeepIOTypes: *keep})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("onnx-fp16: %s -> %s: %d initializers, %d constants, %d casts to float16; %d nodes kept float32; %d casts inserted\n",
		flag.Arg(0), flag.Arg(1), st.Initializers, st.Constants, st.Casts, st.KeptFloat32, st.BoundaryCasts)
}
