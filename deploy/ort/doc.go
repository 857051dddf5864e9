// Package ort holds the pinned list of ONNX Runtime files the project ships
// (pins.txt: the "cpu" set, the core every build, test and the CPU image run;
// the "cuda" set, the CUDA image's core and the CUDA provider libraries of its
// release) and the list of libraries the CUDA image's base provides
// (cuda-base-libs.txt). Its test is the packaging test: on a machine without
// a GPU it proves the CUDA image's exact files get as far as a GPU-less
// machine can. It has no non-test code.
package ort
