//go:build cgo && linux && amd64

package ortenv

import (
	"os"
	"os/signal"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// foreignIgnore sets sig's disposition to SIG_IGN at the OS level behind
// Go's back, as a C library (CUDA) does: signal.Ignore would also change
// what Go's runtime believes. The struct is the kernel's sigaction on
// linux/amd64.
func foreignIgnore(t *testing.T, sig syscall.Signal) {
	t.Helper()
	act := struct{ handler, flags, restorer, mask uint64 }{handler: 1} // SIG_IGN
	if _, _, e := syscall.RawSyscall6(syscall.SYS_RT_SIGACTION, uintptr(sig), uintptr(unsafe.Pointer(&act)), 0, 8, 0, 0); e != 0 {
		t.Fatalf("rt_sigaction(%v): %v", sig, e)
	}
}

// The guard keeps every signal Go handles, not only SIGINT and SIGTERM:
// a foreign library replacing SIGUSR2, SIGUSR1 or SIGWINCH (all Go's in a Go
// binary) is undone too, and a restored handler delivers to Go again. Not
// SIGHUP: a process started with it ignored (nohup) keeps it ignored, so Go
// has no handler there to replace and the test failed under nohup.
func TestSignalGuardCoversEverySignalGoHandles(t *testing.T) {
	got := make(chan os.Signal, 1)
	signal.Notify(got, syscall.SIGUSR1)
	defer signal.Reset(syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGWINCH)
	g, err := SaveSignals()
	if err != nil {
		t.Fatal(err)
	}
	// Go installs its handler for nearly every signal (SIGSEGV, SIGURG,
	// SIGCHLD, SIGPIPE, SIGUSR1, SIGUSR2, SIGWINCH, real-time signals…).
	if n := g.Guarded(); n < 25 {
		t.Fatalf("guards %d signals, want every one Go handles (> 25)", n)
	}
	for _, sig := range []syscall.Signal{syscall.SIGUSR2, syscall.SIGUSR1, syscall.SIGWINCH} {
		foreignIgnore(t, sig)
	}
	if n, err := g.RestoreChanged(); n != 3 || err != nil {
		t.Fatalf("after three replaced handlers: restored %d, %v; want 3", n, err)
	}
	if n, _ := g.RestoreChanged(); n != 0 {
		t.Errorf("restored again (%d) though nothing changed", n)
	}
	// Go still believes SIGUSR1 is notified; with its handler back, the
	// signal reaches the channel again.
	if err := syscall.Kill(os.Getpid(), syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	select {
	case <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("SIGUSR1 not delivered after its handler was restored")
	}
}
