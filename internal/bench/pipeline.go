package bench

import (
	"context"
	"fmt"
	"os"
	"runtime/pprof"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/segmentio/kafka-go"

	"github.com/scorer/scorer/consumer"
	"github.com/scorer/scorer/gpupool"
	"github.com/scorer/scorer/internal/config"
	"github.com/scorer/scorer/internal/fanout"
	"github.com/scorer/scorer/internal/fanout/scorecache"
	"github.com/scorer/scorer/internal/measure"
	"github.com/scorer/scorer/internal/produce"
	"github.com/scorer/scorer/internal/scoring"
	"github.com/scorer/scorer/internal/streaming"
	"github.com/scorer/scorer/model"
	"github.com/scorer/scorer/schema"
)

// recordedBatch is one inference batch as the pool handed it to its
// engine, and how long the engine took.
type recordedBatch struct {
	pairs []model.Pair
	start time.Time
	dur   time.Duration
}

// batchRecorder collects what a pipeline run did at two levels: the pool's
// batches (for the raw-ORT replay at the same shapes) and the pair lists in
// arrival order (for the unsorted-batching padding baseline).
type batchRecorder struct {
	keep     bool // keep pairs; off for runs that only need timings
	mu       sync.Mutex
	batches  []recordedBatch
	arrivals [][]model.Pair
}

func (r *batchRecorder) addBatch(pairs []model.Pair, start time.Time, d time.Duration) {
	b := recordedBatch{start: start, dur: d}
	if r.keep {
		// The pool may reuse its slice; the Pair values (slice headers over
		// token IDs nobody mutates) are what we replay.
		b.pairs = slices.Clone(pairs)
	}
	r.mu.Lock()
	r.batches = append(r.batches, b)
	r.mu.Unlock()
}

// reset forgets what was recorded so far.
func (r *batchRecorder) reset() {
	r.mu.Lock()
	r.batches, r.arrivals = nil, nil
	r.mu.Unlock()
}

func (r *batchRecorder) addArrival(pairs []model.Pair) {
	if !r.keep {
		return
	}
	r.mu.Lock()
	r.arrivals = append(r.arrivals, pairs)
	r.mu.Unlock()
}

// recordingEngine wraps the pool's real engine to record batch shapes and
// engine time; the cost is one clone of slice headers per batch.
type recordingEngine struct {
	gpupool.Engine
	rec       *batchRecorder
	maxLength int
}

// MaxLength passes the wrapped engine's limit through, so the pool checks
// pairs and caps calibration as it does for the unwrapped engine.
func (e recordingEngine) MaxLength() int { return e.maxLength }

func (e recordingEngine) ScorePairs(ctx context.Context, pairs []model.Pair) ([]float32, error) {
	t0 := time.Now()
	out, err := e.Engine.ScorePairs(ctx, pairs)
	if err == nil {
		e.rec.addBatch(pairs, t0, time.Since(t0))
	}
	return out, err
}

// arrivalScorer sits between the TranscriptScorer and the pool and keeps
// each call's pairs in the order the transcripts produced them.
type arrivalScorer struct {
	inner fanout.PairScorer
	rec   *batchRecorder
}

func (a arrivalScorer) ScorePairs(ctx context.Context, pairs []model.Pair) ([]float32, error) {
	a.rec.addArrival(pairs)
	return a.inner.ScorePairs(ctx, pairs)
}

// timingScorer records how long each consumer batch took to score
// (tokenization and inference): "one batch's inference time" of the latency
// bound.
type timingScorer struct {
	inner consumer.Scorer
	mu    sync.Mutex
	durs  []time.Duration
}

func (t *timingScorer) Score(ctx context.Context, evs []schema.TranscriptEvent) ([]schema.ScoredTranscript, error) {
	t0 := time.Now()
	out, err := t.inner.Score(ctx, evs)
	if err == nil {
		t.mu.Lock()
		t.durs = append(t.durs, time.Since(t0))
		t.mu.Unlock()
	}
	return out, err
}

// ackSink notes when each result was acknowledged by the broker: Publish
// returns only after the ack, so the time after it is the output ack time.
type ackSink struct {
	inner  consumer.Sink
	acked  atomic.Int64 // results and dead letters acknowledged
	target int64
	// all is closed when target records are acknowledged. A channel
	// rather than polling: a 2 ms poll loop showed up in the pipeline's
	// CPU profile as scheduler wake-ups.
	all     chan struct{}
	allOnce sync.Once
	mu      sync.Mutex
	at      map[string]time.Time // call_id → ack time
	dlq     int
}

func (s *ackSink) add(n int64) {
	if s.acked.Add(n) >= s.target {
		s.allOnce.Do(func() { close(s.all) })
	}
}

func (s *ackSink) Publish(ctx context.Context, rs []schema.ScoredTranscript) error {
	if err := s.inner.Publish(ctx, rs); err != nil {
		return err
	}
	now := time.Now()
	s.mu.Lock()
	for i := range rs {
		if _, dup := s.at[rs[i].CallID]; !dup {
			s.at[rs[i].CallID] = now
			s.add(1)
		}
	}
	s.mu.Unlock()
	return nil
}

func (s *ackSink) DeadLetter(ctx context.Context, dls []schema.DeadLetter) error {
	if err := s.inner.DeadLetter(ctx, dls); err != nil {
		return err
	}
	s.mu.Lock()
	s.dlq += len(dls)
	s.mu.Unlock()
	s.add(int64(len(dls)))
	return nil
}

// recordBatches wraps the pool's engine factory so that each engine
// records its batches in rec (nil: none).
func recordBatches(rec *batchRecorder, maxLength int) func(gpupool.EngineFactory) gpupool.EngineFactory {
	return func(inner gpupool.EngineFactory) gpupool.EngineFactory {
		return func(d gpupool.Device) (gpupool.Engine, error) {
			e, err := inner(d)
			if err != nil || rec == nil {
				return e, err
			}
			return recordingEngine{Engine: e, rec: rec, maxLength: maxLength}, nil
		}
	}
}

// pipelineOpts says what one pipeline run produces and how.
type pipelineOpts struct {
	records [][]byte
	keys    []string // call_id of each record: the join key of produce and ack times
	rate    float64  // records per second; 0 = as fast as the broker takes them
	keep    bool     // record pairs for replay and the padding baseline
	timeout time.Duration
	profile string // CPU profile of the measured interval; empty = none
}

// pipelineRun is what a run measured.
type pipelineRun struct {
	records, pairs int
	first, last    time.Time     // first produce, last output ack
	wall           time.Duration // first produce to last output ack
	cpu            time.Duration // this process's user+system CPU over wall
	latencies      []time.Duration
	scoreDurs      []time.Duration
	rec            *batchRecorder
	stats          gpupool.Stats
	device         gpupool.Device
	workers        int // the pool's workers on device
	// shapeTokens and shapeRows are the batch caps the pool planned under.
	shapeTokens, shapeRows int
	dlq                    int
	// cache is the score cache's counts over the run (zero without one).
	cache scorecache.Stats
}

// runPipeline runs what `scorer run` runs, in this process: the topics
// readied and sized (streaming.Prepare), the scoring stack (scoring.Open:
// model, pool, score cache, TranscriptScorer, on rt), the producer and the
// consumer (streaming), against `scorer broker` in a child process; then it
// produces the records and waits until every one is acknowledged on the
// output topic. What the bench adds are wrappers: the engines record their
// batches, the pool's callers their pairs in arrival order, the consumer's
// scorer its batch times and its sink each acknowledgement.
func runPipeline(ctx context.Context, rt *scoring.Runtime, cfg config.Config, m *model.Model, log zerolog.Logger, o pipelineOpts) (*pipelineRun, error) {
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	broker, addr, err := startBrokerChild(ctx, cfg.InputPartitions)
	if err != nil {
		return nil, err
	}
	defer broker.stop(2 * time.Second)
	cfg.KafkaBrokers = []string{addr}
	// The child broker has one node and starts empty, as the in-memory
	// broker of KAFKA_BROKERS=embedded: its topics are created.
	topics, err := streaming.Prepare(ctx, cfg, true, log)
	if err != nil {
		return nil, err
	}

	reg := prometheus.NewRegistry()
	rec := &batchRecorder{keep: o.keep}
	stack, err := scoring.Open(ctx, cfg, log, reg, scoring.OnRuntime(rt), scoring.WithModel(m),
		scoring.WrapEngines(recordBatches(rec, m.MaxLength)),
		scoring.WrapPairs(func(p fanout.PairScorer) fanout.PairScorer { return arrivalScorer{inner: p, rec: rec} }))
	if err != nil {
		return nil, err
	}
	// The CPU pool calibrates its memory model with one-row batches while
	// it opens; they are not the run's, and would be replayed as raw work
	// and start the time split before the first record was produced.
	rec.reset()
	stackClosed := false
	defer func() {
		if !stackClosed {
			// On an error or Ctrl-C, do not drain the queued batches
			// (minutes on a CPU): cancel them after a short grace.
			cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_ = stack.Close(cctx)
		}
	}()
	pool := stack.Pool

	prod, err := streaming.NewProducer(topics, log, reg)
	if err != nil {
		return nil, err
	}
	defer prod.Close(context.Background())
	sink := &ackSink{inner: prod, at: map[string]time.Time{}, target: int64(len(o.records)), all: make(chan struct{})}
	scorer := &timingScorer{inner: stack.Scorer}
	cons, err := streaming.NewConsumer(cfg, topics, scorer, sink, log.With().Str("component", "consumer").Logger(), reg)
	if err != nil {
		return nil, err
	}
	cctx, stopCons := context.WithCancel(ctx)
	consDone := make(chan error, 1)
	go func() { consDone <- cons.Run(cctx) }()
	defer func() { stopCons(); <-consDone }()
	for !cons.Ready() {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("bench: consumer not ready: %w", ctx.Err())
		case err := <-consDone:
			return nil, fmt.Errorf("bench: consumer stopped before ready: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
	}

	w := produce.NewInputWriter(cfg.KafkaBrokers, cfg.InputTopic, topics.Security.Transport(cfg.ClientID))
	w.BatchTimeout = time.Millisecond // each paced record goes out at once
	defer w.Close()

	if o.profile != "" {
		f, err := os.Create(o.profile)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return nil, err
		}
		defer pprof.StopCPUProfile() // also on error paths; a second Stop is a no-op
	}
	cpu0 := measure.CPUTime()
	sent, err := produceTimed(ctx, w, o.records, o.keys, o.rate)
	if err != nil {
		return nil, err
	}
	select {
	case <-sink.all:
	case <-ctx.Done():
		return nil, fmt.Errorf("bench: %d of %d records acknowledged: %w", sink.acked.Load(), len(o.records), ctx.Err())
	case err := <-consDone:
		consDone <- err
		return nil, fmt.Errorf("bench: consumer stopped: %v", err)
	}
	cpu1 := measure.CPUTime()
	if o.profile != "" {
		pprof.StopCPUProfile()
	}

	r := &pipelineRun{records: len(o.records), rec: rec, cpu: cpu1 - cpu0}
	sink.mu.Lock()
	first, last := time.Time{}, time.Time{}
	for _, t := range sent {
		if first.IsZero() || t.Before(first) {
			first = t
		}
	}
	for k, at := range sink.at {
		if at.After(last) {
			last = at
		}
		if t, ok := sent[k]; ok {
			r.latencies = append(r.latencies, at.Sub(t))
		}
	}
	r.dlq = sink.dlq
	sink.mu.Unlock()
	r.first, r.last = first, last
	r.wall = last.Sub(first)
	scorer.mu.Lock()
	r.scoreDurs = slices.Clone(scorer.durs)
	scorer.mu.Unlock()
	r.stats = pool.Stats()
	r.shapeTokens, r.shapeRows = pool.BatchShape()
	r.pairs = int(r.stats.Pairs)
	if stack.Cache != nil {
		r.cache = stack.Cache.Stats()
	}
	if len(r.stats.Devices) > 0 {
		r.device = r.stats.Devices[0].Device
		r.workers = r.stats.Devices[0].Workers
	}
	stopCons()
	<-consDone
	consDone <- nil // for the deferred receive
	stackClosed = true
	if err := stack.Close(context.Background()); err != nil {
		return nil, err
	}
	return r, nil
}

// produceTimed writes the records keyed by their call_id and returns when
// each was sent. Each record's timestamp is set just before its write, so
// the consumer's end-to-end histogram and our latencies measure from the
// same instant; ProduceLines stamps a record before waiting for its rate
// tick, which would add up to one tick of phantom latency at a low rate.
func produceTimed(ctx context.Context, w *kafka.Writer, recs [][]byte, keys []string, rate float64) (map[string]time.Time, error) {
	sent := make(map[string]time.Time, len(recs))
	const chunk = 64
	start := time.Now()
	for i := 0; i < len(recs); {
		n := chunk
		if rate > 0 {
			n = 1
			due := start.Add(time.Duration(float64(i) / rate * float64(time.Second)))
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(time.Until(due)):
			}
		}
		n = min(n, len(recs)-i)
		now := time.Now()
		msgs := make([]kafka.Message, n)
		for j := range msgs {
			msgs[j] = kafka.Message{Key: []byte(keys[i+j]), Value: recs[i+j], Time: now}
			sent[keys[i+j]] = now
		}
		if err := w.WriteMessages(ctx, msgs...); err != nil {
			return nil, fmt.Errorf("bench: produce: %w", err)
		}
		i += n
	}
	return sent, nil
}

// timeSplit divides a pipeline run's wall time into the lead-in before the
// first inference batch, the tail after the last, engine time, and engine
// idle time in between: where a pipeline/raw ratio below 1 comes from.
type timeSplit struct {
	LeadInMs   float64 `json:"lead_in_ms"`
	TailMs     float64 `json:"tail_ms"`
	EngineMs   float64 `json:"engine_ms"`
	IdleGapsMs float64 `json:"idle_gaps_ms"`
}
