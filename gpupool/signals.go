package gpupool

// SignalGuard keeps the process's signal handlers across CUDA calls made
// outside a Pool (the pool guards its own): save before the first CUDA call,
// RestoreChanged after each. CUDA's execution provider can replace Go's
// SIGINT/SIGTERM handlers with ones lacking SA_ONSTACK (onnxruntime_go
// #140): Ctrl+C then crashes the runtime instead of ending the context.
// Safe for use by one goroutine at a time.
type SignalGuard struct{ g *signalGuard }

// SaveSignals records the dispositions of every signal Go handles, plus
// SIGINT and SIGTERM. Call it before anything loads CUDA.
func SaveSignals() (*SignalGuard, error) {
	g, err := saveSignals()
	if err != nil {
		return nil, err
	}
	return &SignalGuard{g: g}, nil
}

// RestoreChanged puts back every saved disposition that changed since
// SaveSignals and says how many it restored.
func (s *SignalGuard) RestoreChanged() (int, error) { return s.g.restoreChanged() }
