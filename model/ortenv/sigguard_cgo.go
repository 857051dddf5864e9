//go:build cgo && unix

package ortenv

/*
#include <signal.h>
#include <string.h>

// ortenv_sigsave holds every signal's disposition from before CUDA
// initialisation and which of them the guard keeps: those Go's runtime
// handles (their handler is the one Go installed for SIGSEGV, the same
// trampoline for every signal it handles), plus SIGINT and SIGTERM, on
// which a service's graceful shutdown depends.
typedef struct {
	struct sigaction sa[NSIG];
	unsigned char guarded[NSIG];
	int n;
} ortenv_sigsave;

static int ortenv_save(ortenv_sigsave *s) {
	memset(s, 0, sizeof(*s));
	struct sigaction segv;
	if (sigaction(SIGSEGV, NULL, &segv) != 0) return -1;
	for (int i = 1; i < NSIG; i++) {
		if (i == SIGKILL || i == SIGSTOP) continue;
		// glibc reserves a few real-time signals for itself: EINVAL.
		if (sigaction(i, NULL, &s->sa[i]) != 0) continue;
		int goHandled = (segv.sa_flags & SA_SIGINFO) && (s->sa[i].sa_flags & SA_SIGINFO) &&
			s->sa[i].sa_sigaction == segv.sa_sigaction;
		if (goHandled || i == SIGINT || i == SIGTERM) {
			s->guarded[i] = 1;
			s->n++;
		}
	}
	return 0;
}

// ortenv_restore_changed puts back every guarded disposition that differs
// from the saved one (handler or flags) and returns how many it restored,
// or -1 on error. Reading some sixty sigactions costs a few microseconds,
// cheap beside a GPU run, after each of which the pool calls it.
static int ortenv_restore_changed(const ortenv_sigsave *s) {
	int n = 0;
	for (int i = 1; i < NSIG; i++) {
		if (!s->guarded[i]) continue;
		struct sigaction cur;
		if (sigaction(i, NULL, &cur) != 0) return -1;
		if (cur.sa_sigaction != s->sa[i].sa_sigaction || cur.sa_flags != s->sa[i].sa_flags) {
			if (sigaction(i, &s->sa[i], NULL) != 0) return -1;
			n++;
		}
	}
	return n;
}

static int ortenv_restore(const ortenv_sigsave *s) {
	for (int i = 1; i < NSIG; i++) {
		if (s->guarded[i] && sigaction(i, &s->sa[i], NULL) != 0) return -1;
	}
	return 0;
}
*/
import "C"

import "errors"

// SignalGuard holds the dispositions of every signal Go handles (and of
// SIGINT and SIGTERM) from before CUDA initialisation: save before the
// first CUDA call, RestoreChanged after each. The CUDA execution provider
// can install its own handlers without SA_ONSTACK (onnxruntime_go #140),
// which makes the Go runtime die with "non-Go code set up signal handler
// without SA_ONSTACK flag" on Ctrl+C and stops signal.NotifyContext from
// working. Go cannot re-install its own handler (signal.Notify is a no-op
// for a signal it already handles), so the only fix is restoring the saved
// sigaction. The pool guards its own GPU runs; the doctor and gpu-proof
// guard the CUDA calls they make outside a pool. Safe for use by one
// goroutine at a time.
type SignalGuard struct{ s C.ortenv_sigsave }

// SaveSignals records the dispositions of every signal Go handles, plus
// SIGINT and SIGTERM. Call it before anything loads CUDA.
func SaveSignals() (*SignalGuard, error) {
	g := &SignalGuard{}
	if C.ortenv_save(&g.s) != 0 {
		return nil, errors.New("ortenv: saving signal handlers failed")
	}
	return g, nil
}

// Restore puts back every saved disposition.
func (g *SignalGuard) Restore() error {
	if C.ortenv_restore(&g.s) != 0 {
		return errors.New("ortenv: restoring signal handlers failed")
	}
	return nil
}

// Guarded is how many signals the guard keeps.
func (g *SignalGuard) Guarded() int { return int(g.s.n) }

// RestoreChanged restores any guarded handler that no longer matches the
// saved one and reports how many it restored. CUDA (or a library it loads)
// may install handlers lazily on any run, not only the first, so the pool
// checks after every GPU run.
func (g *SignalGuard) RestoreChanged() (int, error) {
	n := C.ortenv_restore_changed(&g.s)
	if n < 0 {
		return 0, errors.New("ortenv: checking signal handlers failed")
	}
	return int(n), nil
}
