//go:build !(cgo && unix)

package ortenv

// SignalGuard is a no-op where there is no cgo or no sigaction; CUDA cannot
// run there anyway.
type SignalGuard struct{}

// SaveSignals saves nothing here.
func SaveSignals() (*SignalGuard, error) { return &SignalGuard{}, nil }

// Restore has nothing to restore.
func (g *SignalGuard) Restore() error { return nil }

// RestoreChanged has nothing to restore.
func (g *SignalGuard) RestoreChanged() (int, error) { return 0, nil }

// Guarded is 0: no signal is kept.
func (g *SignalGuard) Guarded() int { return 0 }
