// Package ortenv is the process's ONNX Runtime environment: loading the
// library and creating the one environment (InitRuntime), asking a library
// what it was built with (ProbeRuntime), and glibc's malloc settings that
// make ONNX Runtime's memory independent of the thread a cgo call ran on
// (set by a C constructor before main in every binary that links this
// package; TrimMalloc hands free heap pages back, SessionHeap lets the heap
// keep large blocks while a session is created), the signal guard CUDA
// calls need (SignalGuard), and the host checks that say why the CUDA path
// cannot run here (DiagnoseCUDA, FindCUDALibraries).
//
// It sits below model, which runs sessions in this environment, and
// imports nothing of this module: what a pod needs from the host to run
// ONNX Runtime is read in one place.
package ortenv
