//go:build !(cgo && unix)

package gpupool

// signalGuard is a no-op where there is no cgo or no sigaction; CUDA cannot
// run there anyway.
type signalGuard struct{}

func saveSignals() (*signalGuard, error) { return &signalGuard{}, nil }

func (g *signalGuard) restore() error { return nil }

func (g *signalGuard) restoreChanged() (int, error) { return 0, nil }

func (g *signalGuard) guarded() int { return 0 }
