// Package scoring is the one way from the settings to a scorer: Open starts
// the ONNX Runtime environment, the model, NVML and the device pool, the
// score cache and the transcript scorer, each from the configuration's own
// settings (package config), and Stack.Close closes them in reverse. Every
// subcommand that scores builds its stack with Open: `scorer run` and
// `score` as configured; `compare`, `bench`, `doctor` and `gpu-proof` with
// options for what they vary (another Runtime or model already loaded, a
// wrapped engine, one GPU, no cache; options.go). No other package calls
// gpupool.New. A Runtime (ORT and NVML) shared by several stacks keeps the
// rule their closes share: after a pool that did not finish closing,
// nothing unloads NVML or ONNX Runtime.
package scoring
