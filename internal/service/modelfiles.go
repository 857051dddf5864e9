package service

import (
	"context"
	"errors"
	"time"

	"github.com/scorer/scorer/model"
)

// modelFilesEvery is how often watchModelFiles looks at the model's files:
// a stat each while nothing changed, so often enough that a liveness probe
// sees a change within a period or two.
const modelFilesEvery = 5 * time.Second

// watchModelFiles fails /healthz once the model's files no longer hold the
// bytes that were loaded: written in place, replaced or removed under the
// running pod (a `cp` over model.onnx, a sync sidecar, a volume update
// before the rolling restart).
//
// Why liveness and not only the refusal model.NewSession already makes: CPU
// sessions read their weights from the mapped files for as long as they are
// open, so an in-place write changes the scores they give under the old
// version (or ends in SIGBUS when the file shrinks), and every session made
// later (the CPU fallback, a GPU's return) is refused. A restart loads the
// model as it is now. Sticky: scores may already have come from other bytes,
// and a file changed back does not undo that. A touch, or the same bytes
// copied over, costs one hash and fails nothing.
func (r *runner) watchModelFiles(context.Context) error {
	m := r.stack.Model
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(modelFilesEvery)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			err := m.CheckFiles()
			switch {
			case err == nil:
			case errors.Is(err, model.ErrModelFileChanged):
				if r.health.modelChanged.CompareAndSwap(nil, &err) {
					r.log.Error().Err(err).Msg("liveness failing: the model's files changed under the running process; its sessions may score with other weights than the version it reports")
				}
				return
			default:
				r.log.Warn().Err(err).Msg("could not check the model's files; trying again")
			}
		}
	}()
	r.onClose(func(context.Context) error { close(stop); <-done; return nil })
	return nil
}
