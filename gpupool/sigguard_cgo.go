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
