package ortenv

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	ort "github.com/yalue/onnxruntime_go"
)

// explain wraps err as its CUDAProblem when DiagnoseCUDA knows it.
func explain(err error) error {
	if p, ok := DiagnoseCUDA(err); ok {
		return p
	}
	return err
}

// AppendCUDA adds the CUDA execution provider with opts (ORT's CUDA
// provider options: device_id, gpu_mem_limit, use_tf32, ...) to so. ORT
// loads the provider libraries while the options are updated, so that
// step's error is the one naming a missing file; every error is diagnosed
// (a *CUDAProblem where the cause is known).
func AppendCUDA(so *ort.SessionOptions, opts map[string]string) error {
	po, err := ort.NewCUDAProviderOptions()
	if err != nil {
		return fmt.Errorf("ortenv: CUDA provider options: %w", explain(err))
	}
	defer po.Destroy()
	if err := po.Update(opts); err != nil {
		return fmt.Errorf("ortenv: setting CUDA provider options: %w", explain(err))
	}
	if err := so.AppendExecutionProviderCUDA(po); err != nil {
		return fmt.Errorf("ortenv: appending CUDA execution provider: %w", explain(err))
	}
	return nil
}

// CheckCUDA appends the CUDA execution provider with opts to throwaway
// session options, exactly as a CUDA session is created, without loading a
// model. A nil error means ORT's CUDA provider loaded with its libraries,
// the CUDA runtime and the driver; otherwise the error is a *CUDAProblem
// where the cause is known (errors.As). The environment must exist
// (InitRuntime). Loading the provider can load CUDA, which may replace
// signal handlers; CheckCUDA restores any it replaced before it returns.
func CheckCUDA(opts map[string]string) error {
	if g, err := SaveSignals(); err == nil {
		defer g.RestoreChanged()
	}
	so, err := ort.NewSessionOptions()
	if err != nil {
		return fmt.Errorf("ortenv: creating session options: %w", err)
	}
	defer so.Destroy()
	return AppendCUDA(so, opts)
}

// CUDAKey names CUDA provider options for a session's memory key, so the
// GPU calibration cache tells TF32 from full fp32 and one arena cap from
// another (a cap decides which calibration shapes run out of memory).
// device_id is left out: the device's UUID names it in the cache key, and
// its CUDA ordinal moves with CUDA_VISIBLE_DEVICES.
func CUDAKey(opts map[string]string) string {
	var b strings.Builder
	b.WriteString("cuda")
	for _, k := range slices.Sorted(maps.Keys(opts)) {
		if k != "device_id" {
			fmt.Fprintf(&b, " %s=%s", k, opts[k])
		}
	}
	return b.String()
}
