package gpupool

import "fmt"

// gpuFit is a GPU's calibrated memory per batch, MemoryModel's fitted
// terms: bytes ≈ Base + PerRow·rows + PerToken·rows·len +
// PerTokenLen·rows·len², times the margins, HeldOut among them.
type gpuFit struct {
	Base        float64 `json:"base_bytes"`
	PerRow      float64 `json:"bytes_per_row"`
	PerToken    float64 `json:"bytes_per_token"`
	PerTokenLen float64 `json:"bytes_per_token_len"`
	HeldOut     float64 `json:"held_out_error"`
}

// usable reports whether f could have come from fitActivations: finite,
// not negative, growing with the batch, its held-out margin within the cap.
func (f gpuFit) usable() bool {
	return usableTerms(f.Base, f.PerRow, f.PerToken, f.PerTokenLen, f.HeldOut) &&
		(f.PerRow > 0 || f.PerToken > 0 || f.PerTokenLen > 0) && f.HeldOut <= maxHeldOut
}

func gpuFitOf(e MemoryModel) gpuFit {
	return gpuFit{Base: e.Base, PerRow: e.PerRow, PerToken: e.PerToken, PerTokenLen: e.PerTokenLen, HeldOut: e.HeldOut}
}

// gpuFitCacheVersion changes whenever calibrate or fitActivations measure
// or fit differently, so no fit of an earlier method is reused.
const gpuFitCacheVersion = 1

// gpuFitCache returns where dev's calibration is kept, or why nothing is.
// The key is everything the fit depends on: the GPU (its UUID, which names
// it whatever CUDA ordinal it has, its name and memory), the engine's
// MemoryKey (model.Session: the model's version and output type, ONNX
// Runtime's release, the session's memory and CUDA provider options, TF32
// and the arena cap among them: a cap decides which shapes run out of
// memory), the calibration's shapes and token, and how memory was read
// (per process or device-wide, from an emptied arena or as high-water
// marks, which change the readings the fit is made from). A device-wide
// reading is named "device-alone": calibrate keeps such a fit only when no
// other process moved the device's memory meanwhile, and fits the releases
// before that check kept under "device" may carry a neighbour's
// allocations.
func (p *Pool) gpuFitCache(dev Device, eng Engine, shapes []Shape, perProcess, emptied bool) (*fitCache, string) {
	dir := p.cfg.gpuCalCache
	if dir == "" {
		return nil, "cache off"
	}
	memKey := memoryKey(eng)
	if memKey == "" {
		return nil, "the engine names no memory key"
	}
	if dev.UUID == "" {
		return nil, "the GPU has no UUID"
	}
	reading := "device-alone"
	if perProcess {
		reading = "process"
	}
	key := fmt.Sprintf("v=%d %s gpu=%s name=%q total=%d shapes=%v token_id=%d reading=%s emptied=%t",
		gpuFitCacheVersion, memKey, dev.UUID, dev.Name, dev.TotalMemory, shapes, p.cfg.calibration.TokenID, reading, emptied)
	return newFitCache(dir, "gpu", key), ""
}
