package bench

import (
	"context"
	"fmt"
	"hash/fnv"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/scorer/scorer/internal/config"
	"github.com/scorer/scorer/internal/fanout/scorecache"
	"github.com/scorer/scorer/internal/measure"
	"github.com/scorer/scorer/internal/scoring"
	"github.com/scorer/scorer/model"
	"github.com/scorer/scorer/schema"
)

// benchRevision is the revision section: a workload of transcripts that
// arrive in several versions, scored with the cache off, on and capped.
func benchRevision(ctx context.Context, b *benchRun, f *folder) error {
	bf := b.bf
	lines := spreadSample(b.corpus, bf.revisionN)
	_, _, evs := splitLines(lines)
	progress(b.e, "%s: revision workload, %d transcripts × %d versions, %.0f%% edited, cache off / on / capped at %d bytes", f.name, len(evs), bf.revisionVers, 100*bf.revisionEdit, bf.revisionCap)
	capBytes := int64(f.cfg.ScoreCacheBytes)
	if capBytes == 0 {
		capBytes = 256 << 20 // SCORE_CACHE_BYTES=0 turns the service's cache off, not this section
	}
	end := b.mt.begin("revision")
	rev, err := runRevision(ctx, b.rt, f.cfg, f.m, evs, bf.revisionVers, bf.revisionEdit, capBytes, bf.revisionCap, bf.revisionRnds)
	f.pr.Revision = rev
	end()
	return err
}

// revisionResult is the score cache on a revision workload: every
// transcript arrives in several versions, each with a share of its
// sentences edited, scored with the cache off and on.
type revisionResult struct {
	Transcripts int     `json:"transcripts"`
	Versions    int     `json:"versions"`
	EditShare   float64 `json:"edit_share"`
	Pairs       int     `json:"pairs"`
	// InferredOff and InferredOn are pairs that reached inference.
	InferredOff    uint64  `json:"inferred_off"`
	InferredOn     uint64  `json:"inferred_on"`
	Saved          float64 `json:"pairs_saved"`
	SecondsOff     float64 `json:"seconds_off"`
	SecondsOn      float64 `json:"seconds_on"`
	PairsPerSecOff float64 `json:"pairs_per_sec_off"`
	PairsPerSecOn  float64 `json:"pairs_per_sec_on"`
	Speedup        float64 `json:"speedup"`
	// CPUSecondsOff and CPUSecondsOn are process CPU time (all threads);
	// CPUSpeedup compares pairs per CPU-second, which other tenants of a
	// shared machine disturb much less than wall time.
	CPUSecondsOff float64 `json:"cpu_seconds_off"`
	CPUSecondsOn  float64 `json:"cpu_seconds_on"`
	CPUSpeedup    float64 `json:"cpu_speedup"`
	Rounds        int     `json:"rounds"`
	CacheCapBytes int64   `json:"cache_cap_bytes"`
	CacheBytes    int64   `json:"cache_bytes"`
	CacheEntries  int64   `json:"cache_entries"`
	// The capped run repeats the workload with a cache far smaller than
	// its distinct pairs: it must evict, stay at its cap, and RSS must
	// stay flat once the cap is reached.
	CappedCapBytes  int64     `json:"capped_cap_bytes"`
	CappedBytes     int64     `json:"capped_bytes"`
	CappedEvictions int64     `json:"capped_evictions"`
	CappedInferred  uint64    `json:"capped_inferred"`
	CappedRSSMiB    []float64 `json:"capped_rss_mib_after_each_version"`
	SavedTarget     float64   `json:"pairs_saved_target"`
	SpeedupTarget   float64   `json:"speedup_target"`
	OK              bool      `json:"ok"`
}

// revisionWorkload is every event in versions versions: version 1 as is,
// each later one editing a share of the previous version's sentences, in
// arrival order (all first versions, then all second versions, …). Edits
// are chosen by a hash of (call_id, version, sentence), so runs repeat.
func revisionWorkload(evs []schema.TranscriptEvent, versions int, share float64) [][]schema.TranscriptEvent {
	out := make([][]schema.TranscriptEvent, versions)
	prev := evs
	for v := range versions {
		cur := make([]schema.TranscriptEvent, len(prev))
		for i, ev := range prev {
			ev.VersionID = strconv.Itoa(v + 1)
			if v > 0 {
				secs := make(map[string][]string, len(ev.Sections))
				for name, sents := range ev.Sections {
					s := append([]string(nil), sents...)
					for j := range s {
						h := fnv.New64a()
						fmt.Fprintf(h, "%s/%d/%s/%d", ev.CallID, v, name, j)
						if float64(h.Sum64()%10000) < share*10000 {
							s[j] = editSentence(s[j], v)
						}
					}
					secs[name] = s
				}
				ev.Sections = secs
			}
			cur[i] = ev
		}
		out[v] = cur
		prev = cur
	}
	return out
}

// editSentence is a correction as a transcript editor makes them: a word
// fixed, here the last one doubled with a version mark.
func editSentence(s string, v int) string {
	s = strings.TrimRight(s, ".?! ")
	if i := strings.LastIndexByte(s, ' '); i >= 0 {
		return s[:i] + " " + s[i+1:] + fmt.Sprintf(" (rev %d).", v)
	}
	return s + fmt.Sprintf(" (rev %d).", v)
}

// runRevision scores the workload through a CPU pool, chunk transcripts
// per call as the consumer batches them: cache off and on at capBytes in
// alternating rounds (each keeps its best), then once at cappedBytes.
func runRevision(ctx context.Context, rt *scoring.Runtime, cfg config.Config, m *model.Model, evs []schema.TranscriptEvent, versions int, share float64, capBytes, cappedBytes int64, rounds int) (*revisionResult, error) {
	work := revisionWorkload(evs, versions, share)
	r := &revisionResult{Transcripts: len(evs), Versions: versions, EditShare: share, CacheCapBytes: capBytes,
		CappedCapBytes: cappedBytes, SavedTarget: revisionSavedTarget.bound, SpeedupTarget: revisionSpeedTarget.bound}
	for _, v := range work {
		for i := range v {
			r.Pairs += v[i].SentenceCount() * len(cfg.Labels)
		}
	}
	chunk := max(cfg.BatchMaxMessages, 1)
	run := func(cache *scorecache.Cache, after func()) (inferred uint64, wall, cpu time.Duration, err error) {
		cs, err := newCPUScorer(ctx, rt, cfg, m, cache)
		if err != nil {
			return 0, 0, 0, err
		}
		defer cs.close()
		if err := cs.warm(ctx, evs[0]); err != nil {
			return 0, 0, 0, err
		}
		before := cs.pool.Stats().Pairs
		for _, v := range work {
			run, err := measure.Chunks(ctx, v, measure.Every(chunk), cs.ts.Score)
			if err != nil {
				return 0, 0, 0, err
			}
			wall, cpu = wall+run.Wall, cpu+run.CPU
			if after != nil {
				after()
			}
		}
		return cs.pool.Stats().Pairs - before, wall, cpu, nil
	}
	r.Rounds = rounds
	for round := range rounds {
		inferred, wall, cpu, err := run(nil, nil)
		if err != nil {
			return nil, fmt.Errorf("bench: revision, cache off: %w", err)
		}
		if round == 0 || wall.Seconds() < r.SecondsOff {
			r.SecondsOff = wall.Seconds()
		}
		if round == 0 || cpu.Seconds() < r.CPUSecondsOff {
			r.CPUSecondsOff = cpu.Seconds()
		}
		r.InferredOff = inferred
		// A fresh cache each round: every round measures the same cold
		// start on version 1.
		cache, err := scorecache.New(capBytes, nil)
		if err != nil {
			return nil, err
		}
		if inferred, wall, cpu, err = run(cache, nil); err != nil {
			return nil, fmt.Errorf("bench: revision, cache on: %w", err)
		}
		if round == 0 || wall.Seconds() < r.SecondsOn {
			r.SecondsOn = wall.Seconds()
		}
		if round == 0 || cpu.Seconds() < r.CPUSecondsOn {
			r.CPUSecondsOn = cpu.Seconds()
		}
		r.InferredOn = inferred
		st := cache.Stats()
		r.CacheBytes, r.CacheEntries = st.Bytes, st.Entries
	}
	capped, err := scorecache.New(cappedBytes, nil)
	if err != nil {
		return nil, err
	}
	r.CappedInferred, _, _, err = run(capped, func() {
		if pm, err := readProcMemory(os.Getpid()); err == nil {
			r.CappedRSSMiB = append(r.CappedRSSMiB, float64(pm.RSSKiB)/1024)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("bench: revision, capped cache: %w", err)
	}
	st := capped.Stats()
	r.CappedBytes, r.CappedEvictions = st.Bytes, st.Evictions
	r.PairsPerSecOff = float64(r.Pairs) / r.SecondsOff
	r.PairsPerSecOn = float64(r.Pairs) / r.SecondsOn
	r.Speedup = r.PairsPerSecOn / r.PairsPerSecOff
	r.CPUSpeedup = r.CPUSecondsOff / r.CPUSecondsOn
	r.Saved = 1 - float64(r.InferredOn)/float64(r.InferredOff)
	r.OK = revisionSavedTarget.ok(r.Saved) && revisionSpeedTarget.ok(max(r.Speedup, r.CPUSpeedup))
	return r, nil
}
