// Package scoring opens the scoring stack every subcommand that scores
// shares: the ONNX Runtime environment, the model, NVML and the device
// pool, the score cache and the transcript scorer, each from the
// configuration's own settings (package config), and closes them in
// reverse. `scorer run`, `score`, `compare` and `gpu-proof share` open it
// whole; `bench` and `doctor` take its parts with their own overrides.
package scoring
