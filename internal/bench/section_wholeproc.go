package bench

import (
	"context"
)

// benchWholeproc is the wholeproc section: `scorer score` against the raw
// loop, typical input, on each small model folder.
func benchWholeproc(ctx context.Context, b *benchRun, _ *folder) error {
	var jobs []wholeJob
	for _, d := range b.dirs {
		jobs = append(jobs, wholeJob{dir: d, inputs: []string{"typical"}, rounds: b.bf.wholeRounds, sents: b.bf.wholeSentences, long: 1, section: "wholeproc"})
	}
	_, err := b.runWholeJobs(ctx, jobs)
	return err
}
