// Package ort holds the pinned list of ONNX Runtime files the project ships
// (pins.txt: one CUDA-capable core for every build and test, plus the CUDA
// provider libraries of the same release for the CUDA image) and the list of
// libraries the CUDA image's base provides (cuda-base-libs.txt). Its test is
// the packaging test: on a machine without a GPU it proves the CUDA image's
// exact files get as far as a GPU-less machine can. It has no non-test code.
package ort
