package gpupool

import (
	"context"
	"fmt"

	"github.com/scorer/scorer/model"
)

// Engine scores pairs on one device. model.Session implements it; tests use
// fakes. The pool may call ScorePairs from several workers of the same device
// at once (model.Session is safe for concurrent use), and calls Close once,
// after every worker of the device has stopped.
type Engine interface {
	// ScorePairs returns one score per pair, in order. Errors that mean the
	// device ran out of memory must satisfy errors.Is(err,
	// model.ErrOutOfMemory) so the pool splits the batch instead of blaming
	// the device.
	ScorePairs(ctx context.Context, pairs []model.Pair) ([]float32, error)
	// Close releases the device's session.
	Close() error
}

// DeviceKind says what executes a device's engine.
type DeviceKind int

const (
	// CPU is host execution; it always exists and is the fallback of last
	// resort.
	CPU DeviceKind = iota
	// CUDA is an NVIDIA GPU driven by ONNX Runtime's CUDA execution provider.
	CUDA
)

// String names the kind for logs and metric labels.
func (k DeviceKind) String() string {
	switch k {
	case CPU:
		return "cpu"
	case CUDA:
		return "cuda"
	}
	return fmt.Sprintf("DeviceKind(%d)", int(k))
}

// Device describes one execution device. For CUDA devices Index is the CUDA
// device number (the EP's device_id: the NVML index, or the position in
// CUDA_VISIBLE_DEVICES when that is set) and UUID is the stable identity
// deployments should match on.
type Device struct {
	Kind        DeviceKind
	Index       int
	UUID, Name  string
	TotalMemory uint64
}

// Label is the short name used in logs and the {device} metric label, e.g.
// "cpu" or "cuda:0".
func (d Device) Label() string {
	if d.Kind == CPU {
		return "cpu"
	}
	return fmt.Sprintf("%s:%d", d.Kind, d.Index)
}

// EngineFactory opens an Engine on a device. The pool calls it once per
// device at start, and once more for a CPU engine created lazily when every
// GPU has failed. It must return an error, not panic, when the device cannot
// be used, so auto mode can fall back.
type EngineFactory func(Device) (Engine, error)
