//go:build cgo && unix

package ortenv

import (
	"os"
	"os/signal"
	"testing"
)

// A handler replaced at any point is put back: RestoreChanged sees the
// changed disposition once, restores it, and then finds nothing to do.
func TestSignalGuardRestoresChangedHandlers(t *testing.T) {
	g, err := SaveSignals()
	if err != nil {
		t.Fatal(err)
	}
	defer signal.Reset(os.Interrupt)
	if n, err := g.RestoreChanged(); n != 0 || err != nil {
		t.Fatalf("unchanged handlers: restored %d, %v", n, err)
	}
	signal.Ignore(os.Interrupt) // SIG_IGN at the OS level, as a foreign library might install
	if n, err := g.RestoreChanged(); n != 1 || err != nil {
		t.Fatalf("after a replaced SIGINT handler: restored %d, %v; want 1", n, err)
	}
	if n, _ := g.RestoreChanged(); n != 0 {
		t.Errorf("restored again (%d) though nothing changed", n)
	}
}
