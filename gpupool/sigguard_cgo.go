//go:build cgo && unix

package gpupool

/*
#include <signal.h>
#include <string.h>

// gpupool_guarded lists the signals whose handlers CUDA may replace. They
// are the ones a service's graceful shutdown depends on.
static const int gpupool_guarded[] = { SIGINT, SIGTERM };
#define GPUPOOL_NGUARDED 2

typedef struct { struct sigaction sa[GPUPOOL_NGUARDED]; } gpupool_sigsave;

static int gpupool_save(gpupool_sigsave *s) {
	memset(s, 0, sizeof(*s));
	for (int i = 0; i < GPUPOOL_NGUARDED; i++) {
		if (sigaction(gpupool_guarded[i], NULL, &s->sa[i]) != 0) return -1;
	}
	return 0;
}

// gpupool_restore_changed puts back every guarded disposition that differs
// from the saved one (handler or flags) and returns how many it restored,
// or -1 on error. Reading two sigactions costs a few hundred nanoseconds,
// cheap enough to do after every GPU run.
static int gpupool_restore_changed(const gpupool_sigsave *s) {
	int n = 0;
	for (int i = 0; i < GPUPOOL_NGUARDED; i++) {
		struct sigaction cur;
		if (sigaction(gpupool_guarded[i], NULL, &cur) != 0) return -1;
		if (cur.sa_sigaction != s->sa[i].sa_sigaction || cur.sa_flags != s->sa[i].sa_flags) {
			if (sigaction(gpupool_guarded[i], &s->sa[i], NULL) != 0) return -1;
			n++;
		}
	}
	return n;
}

static int gpupool_restore(const gpupool_sigsave *s) {
	for (int i = 0; i < GPUPOOL_NGUARDED; i++) {
		if (sigaction(gpupool_guarded[i], &s->sa[i], NULL) != 0) return -1;
	}
	return 0;
}
*/
import "C"

import "errors"

// signalGuard holds the SIGINT/SIGTERM dispositions from before CUDA
// initialisation. The CUDA execution provider can install its own handlers
// without SA_ONSTACK (onnxruntime_go #140), which makes the Go runtime die
// with "non-Go code set up signal handler without SA_ONSTACK flag" on
// Ctrl+C and stops signal.NotifyContext from working. Go cannot re-install
// its own handler (signal.Notify is a no-op for a signal it already
// handles), so the only fix is restoring the saved sigaction.
type signalGuard struct{ s C.gpupool_sigsave }

func saveSignals() (*signalGuard, error) {
	g := &signalGuard{}
	if C.gpupool_save(&g.s) != 0 {
		return nil, errors.New("gpupool: saving signal handlers failed")
	}
	return g, nil
}

func (g *signalGuard) restore() error {
	if C.gpupool_restore(&g.s) != 0 {
		return errors.New("gpupool: restoring signal handlers failed")
	}
	return nil
}

// restoreChanged restores any guarded handler that no longer matches the
// saved one and reports how many it restored. CUDA (or a library it loads)
// may install handlers lazily on any run, not only the first, so the pool
// checks after every GPU run.
func (g *signalGuard) restoreChanged() (int, error) {
	n := C.gpupool_restore_changed(&g.s)
	if n < 0 {
		return 0, errors.New("gpupool: checking signal handlers failed")
	}
	return int(n), nil
}
