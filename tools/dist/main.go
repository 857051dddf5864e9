// Command dist builds the portable GPU bundle (internal/dist) for `make
// dist`:
//
//	dist -version V -binary bin/scorer -ort .deps/ort-cuda -out dist [-level better]
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/klauspost/compress/zstd"

	"github.com/scorer/scorer/internal/dist"
)

func main() {
	var o dist.Options
	flag.StringVar(&o.Version, "version", "", "bundle version (required)")
	flag.StringVar(&o.Binary, "binary", "bin/scorer", "scorer executable")
	flag.StringVar(&o.ORTDir, "ort", ".deps/ort-cuda", "ONNX Runtime CUDA set (`make cuda-ort`)")
	flag.StringVar(&o.Launcher, "launcher", "deploy/dist/scorer", "launcher script")
	flag.StringVar(&o.README, "readme", "deploy/dist/README.md", "bundle README")
	flag.StringVar(&o.OutDir, "out", "dist", "output folder")
	// fastest is for tests, which check the bundle, not its size (the CUDA set is ~270 MB).
	level := flag.String("level", "better", "zstd level: fastest, default, better or best")
	flag.Parse()
	ok, lvl := zstd.EncoderLevelFromString(*level)
	if !ok {
		fmt.Fprintf(os.Stderr, "dist: -level %q: want fastest, default, better or best\n", *level)
		os.Exit(2)
	}
	o.Level = lvl
	out, err := dist.Build(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(out)
}
