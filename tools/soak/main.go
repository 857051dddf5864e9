// Command soak is the randomized fault soak (`make soak`, docs/reliability.md,
// "Randomized fault soak"): the project's own broker (kfake persisting to a
// data dir) behind internal/faultproxy, four `scorer run` processes of the
// built binary in one group, a producer writing small real transcripts in
// several versions per call_id, and for the given minutes faults drawn at
// random from a seeded generator: a scorer SIGKILLed and restarted, scorers
// joining and leaving, the broker restarted, commits refused, a partition's
// log start moved past unread records, the input topic deleted and
// re-created, delay, resets and a frozen network, poison records. Then the
// faults stop, the group catches up, and the checker reads the output topic
// and the DLQ back and prints one line: its verdict. It exits 1 when a bound
// is broken (anything lost or reordered, a valid transcript dead-lettered,
// duplicates past what the crashes allow, a scorer exiting unasked or not
// cleanly after SIGTERM, a partition stuck longer than the catch-up time,
// the long-lived scorer's memory or goroutines growing), 2 when the soak
// itself could not run. -inject-wrong-dlq makes scorer B dead-letter valid
// transcripts, to see the verdict FAIL.
//
//	soak [-minutes 10] [-seed N] [-scorer bin/scorer] [-model-dir DIR] [-transcripts FILE] [-inject-wrong-dlq]
//
// SOAK_MINUTES and SOAK_SEED are the defaults of -minutes and -seed. The
// seed replays the same draws (faults, their timing, the transcripts); the
// machine's timing still differs from run to run, so a replay is the same
// storm, not the same interleaving.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// errSkip is a fault that did not apply (no joiner left to start, nothing
// unread to truncate); another is drawn.
var errSkip = errors.New("skip")

type options struct {
	minutes       float64
	seed          uint64
	scorer        string
	modelDir      string
	transcripts   string
	dir           string
	partitions    int
	maxUncommit   int
	rate          float64
	catchUp       time.Duration
	maxRSSDrift   float64 // MiB
	maxGoroutines float64
	// injectWrongDLQ checks the checker: scorer B runs with
	// MAX_SENTENCES=1, so it dead-letters (too_large) every well-formed
	// transcript of two or three sentences it reads, as a scorer that
	// takes a transient error for a permanent one would. Its run must FAIL.
	injectWrongDLQ bool
}

// soak is one run: its parts and what happened.
type soak struct {
	opt      options
	cl       *cluster
	prod     *producer
	scorers  []*scorer // A (never stopped), B (killed), C and D (join and leave)
	removals []removal
	counts   map[string]int // faults injected, by kind
	// replays counts the faults after which a member may give up partitions
	// with work past its last commit (kills, leaves and joins, broker
	// restarts, resets, freezes): each can replay at most MAX_UNCOMMITTED
	// records per partition.
	replays    int
	termErrors []string
	start      time.Time
	mu         sync.Mutex // guards what watchStalls writes
}

func main() {
	opt := options{}
	minutes, _ := strconv.ParseFloat(cmpOr(os.Getenv("SOAK_MINUTES"), "10"), 64)
	seed, err := strconv.ParseUint(cmpOr(os.Getenv("SOAK_SEED"), "0"), 10, 64)
	if err != nil {
		fmt.Fprintf(os.Stderr, "soak: SOAK_SEED %q: %v\n", os.Getenv("SOAK_SEED"), err)
		os.Exit(2)
	}
	flag.Float64Var(&opt.minutes, "minutes", minutes, "how long faults are injected (SOAK_MINUTES); catching up and checking come after")
	flag.Uint64Var(&opt.seed, "seed", seed, "seed of every random draw (SOAK_SEED); 0 = a new one, printed")
	flag.StringVar(&opt.scorer, "scorer", "bin/scorer", "the scorer binary (make build)")
	flag.StringVar(&opt.modelDir, "model-dir", cmpOr(os.Getenv("SOAK_MODEL_DIR"), "../shared/models/nli-unigram-small"), "model folder (the small one keeps two cores free enough)")
	flag.StringVar(&opt.transcripts, "transcripts", "../shared/data/transcripts/transcripts.jsonl", "transcript corpus the sentences come from")
	flag.StringVar(&opt.dir, "dir", "", "folder for the broker's data and the scorers' logs; empty = a new one under bin/")
	flag.IntVar(&opt.partitions, "partitions", 3, "input and output partitions")
	flag.IntVar(&opt.maxUncommit, "max-uncommitted", 200, "the scorers' MAX_UNCOMMITTED, which bounds the duplicates")
	flag.Float64Var(&opt.rate, "rate", 4, "transcripts written a second")
	flag.DurationVar(&opt.catchUp, "catch-up", 5*time.Minute, "longest wait, after the faults, for the group's commits to reach the end")
	flag.Float64Var(&opt.maxRSSDrift, "max-rss-drift", 128, "largest growth of scorer A's RSS (MiB) from after warm-up to the end")
	flag.Float64Var(&opt.maxGoroutines, "max-goroutine-drift", 50, "largest growth of scorer A's goroutines from after warm-up to the end")
	flag.BoolVar(&opt.injectWrongDLQ, "inject-wrong-dlq", false, "check the checker: scorer B runs with MAX_SENTENCES=1 and dead-letters valid transcripts; the verdict must be FAIL")
	flag.Parse()
	if opt.seed == 0 {
		opt.seed = uint64(time.Now().UnixNano()) % 1_000_000_000
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	line, ok, err := run(ctx, opt)
	if err != nil {
		fmt.Fprintf(os.Stderr, "soak: %v\n", err)
		fmt.Printf("soak: seed=%d ERROR %v\n", opt.seed, err)
		os.Exit(2)
	}
	fmt.Println(line)
	if !ok {
		os.Exit(1)
	}
}

func (s *soak) logf(format string, args ...any) {
	fmt.Printf("soak %6.1fs  %s\n", time.Since(s.start).Seconds(), fmt.Sprintf(format, args...))
}

func run(ctx context.Context, opt options) (string, bool, error) {
	s := &soak{opt: opt, counts: map[string]int{}, start: time.Now()}
	s.logf("SOAK_SEED=%d minutes=%v partitions=%d MAX_UNCOMMITTED=%d rate=%v/s (replay with SOAK_SEED=%d)",
		opt.seed, opt.minutes, opt.partitions, opt.maxUncommit, opt.rate, opt.seed)
	if opt.injectWrongDLQ {
		s.logf("injected: scorer B runs with MAX_SENTENCES=1 and dead-letters valid transcripts; the verdict must be FAIL")
	}
	if opt.dir == "" {
		if err := os.MkdirAll("bin", 0o755); err != nil {
			return "", false, err
		}
		d, err := os.MkdirTemp("bin", fmt.Sprintf("soak-%d-", opt.seed))
		if err != nil {
			return "", false, err
		}
		opt.dir = d
	}
	bin, err := filepath.Abs(opt.scorer)
	if err != nil {
		return "", false, err
	}
	if _, err := os.Stat(bin); err != nil {
		return "", false, fmt.Errorf("scorer binary: %w (make build)", err)
	}
	modelDir, err := filepath.Abs(opt.modelDir)
	if err != nil {
		return "", false, err
	}
	sents, err := corpusSentences(opt.transcripts, 4000)
	if err != nil {
		return "", false, err
	}
	s.logf("work dir %s (broker data, scorer logs); %d corpus sentences", opt.dir, len(sents))

	s.cl, err = startCluster(filepath.Join(opt.dir, "broker"), opt.partitions)
	if err != nil {
		return "", false, err
	}
	defer s.cl.close()
	s.prod, err = newProducer(s.cl.px.Addr(), opt.seed, sents)
	if err != nil {
		return "", false, err
	}
	defer s.prod.close()

	env := append(os.Environ(),
		"KAFKA_BROKERS="+s.cl.px.Addr(), "KAFKA_GROUP_ID="+group, "KAFKA_INPUT_PARTITIONS="+strconv.Itoa(opt.partitions),
		"MODEL_DIR="+modelDir, "LABELS=consumer weakness", "LOG_FORMAT=json", "BATCH_MAX_WAIT=50ms",
		"SHUTDOWN_TIMEOUT=20s", "KAFKA_SESSION_TIMEOUT=10s", "MAX_UNCOMMITTED="+strconv.Itoa(opt.maxUncommit),
		// One worker of one thread each: four scorers share two cores with
		// the broker and the producer.
		"WORKERS=1", "CPU_THREADS=1",
		// A small score cache, so that it fills early and its growth does
		// not read as drift.
		"SCORE_CACHE_BYTES="+strconv.Itoa(8<<20))
	for _, name := range []string{"A", "B", "C", "D"} {
		env := env
		if name == "B" && opt.injectWrongDLQ {
			env = append(env[:len(env):len(env)], "MAX_SENTENCES=1") // the last of a name wins (os/exec)
		}
		sc, err := newScorer(name, bin, env, opt.dir, s.logf)
		if err != nil {
			return "", false, err
		}
		s.scorers = append(s.scorers, sc)
	}
	defer func() {
		for _, sc := range s.scorers {
			sc.stop(syscall.SIGKILL, 10*time.Second)
		}
	}()
	for _, sc := range s.scorers[:2] {
		if err := sc.start(); err != nil {
			return "", false, err
		}
	}
	a := s.scorers[0]
	if err := waitFor(ctx, 3*time.Minute, a.ready); err != nil {
		return "", false, fmt.Errorf("scorer A not ready: %w (log in %s)", err, opt.dir)
	}
	s.logf("scorer A ready")

	prodCtx, stopProd := context.WithCancel(ctx)
	prodDone := make(chan struct{})
	go func() { defer close(prodDone); s.prod.run(prodCtx, opt.rate) }()

	total := time.Duration(opt.minutes * float64(time.Minute))
	warm := min(30*time.Second, total/5)
	sleep(ctx, warm)
	base, err := a.scrape()
	if err != nil {
		stopProd()
		return "", false, fmt.Errorf("scorer A's metrics: %w", err)
	}
	peak := base
	s.logf("baseline of A: RSS %.1f MiB, %v goroutines", base.rss/(1<<20), base.goroutines)

	stallCtx, stopStalls := context.WithCancel(ctx)
	defer stopStalls()
	stall := s.watchStalls(stallCtx)

	// The storm: first every kind once, in a random order, so that even a
	// two-minute run meets each; then draws by weight.
	rng := rand.New(rand.NewPCG(opt.seed, 0xfa17))
	weights := 0
	for _, f := range faults {
		weights += f.weight
	}
	first := rng.Perm(len(faults))
	lastProgress := time.Now()
	end := s.start.Add(total)
	gap := time.Duration(1000+rng.IntN(3000)) * time.Millisecond
	for i := 0; time.Now().Before(end) && ctx.Err() == nil; i++ {
		sleep(ctx, gap)
		if ctx.Err() != nil || !time.Now().Before(end) {
			break
		}
		if m, err := a.scrape(); err == nil {
			peak.rss, peak.goroutines = max(peak.rss, m.rss), max(peak.goroutines, m.goroutines)
			if time.Since(lastProgress) >= time.Minute {
				lastProgress = time.Now()
				ledger, _, _ := s.prod.snapshot()
				s.logf("progress: %d transcripts sent; A: RSS %.1f MiB, %v goroutines", len(ledger), m.rss/(1<<20), m.goroutines)
			}
		}
		var f fault
		if i < len(first) {
			f = faults[first[i]]
		} else {
			w := rng.IntN(weights)
			for _, f = range faults {
				if w -= f.weight; w < 0 {
					break
				}
			}
		}
		what, err := f.do(ctx, s, rng)
		switch {
		case errors.Is(err, errSkip):
			gap = 0
			continue
		case err != nil:
			stopProd()
			return "", false, fmt.Errorf("fault %s: %w", f.name, err)
		}
		s.counts[f.name]++
		s.logf("fault %-15s %s", f.name, what)
		gap = nextGap(rng, f)
	}
	stopProd()
	<-prodDone
	if ctx.Err() != nil {
		return "", false, ctx.Err()
	}
	// How much of the input the group kept up with during the storm: what
	// was left to commit when it ended.
	backlog := int64(-1)
	if c, err := s.cl.committed(ctx); err == nil {
		if o, err := s.cl.offsets(ctx, inputTopic); err == nil {
			backlog = 0
			for p := range int32(opt.partitions) {
				backlog += o.end[p] - min(o.end[p], max(c[p], o.start[p]))
			}
		}
	}

	// Heal and catch up: every member back, then commits to the end.
	if b := s.scorers[1]; !b.running() {
		if err := b.start(); err != nil {
			return "", false, err
		}
	}
	s.logf("faults stopped; waiting for the group's commits to reach the end (at most %v)", opt.catchUp)
	caughtUp, behind := time.Now(), ""
	if err := waitFor(ctx, opt.catchUp, func() bool {
		behind = s.behind(ctx)
		return behind == ""
	}); ctx.Err() != nil {
		return "", false, err
	}
	caughtUpIn := time.Since(caughtUp)
	stopStalls()
	s.mu.Lock()
	stalled := stalls{longest: stall.longest, where: stall.where}
	s.mu.Unlock()
	last, scrapeErr := a.scrape()
	if scrapeErr == nil {
		peak.rss, peak.goroutines = max(peak.rss, last.rss), max(peak.goroutines, last.goroutines)
	}
	for _, sc := range s.scorers {
		if !sc.running() {
			continue
		}
		if err := sc.stop(syscall.SIGTERM, 40*time.Second); err != nil {
			s.termErrors = append(s.termErrors, fmt.Sprintf("%s at the end: %v", sc.name, err))
		}
	}

	ledger, prodErrs, prodLastErr := s.prod.snapshot()
	outs, dlq, err := s.readBack(ctx)
	if err != nil {
		return "", false, fmt.Errorf("reading back: %w", err)
	}
	o := outcome{sent: len(ledger), t: check(ledger, s.removals, outs, dlq), removals: s.removals, counts: s.counts,
		replays: s.replays, behind: behind, caughtUpIn: caughtUpIn, backlog: backlog, stall: stalled,
		exits: map[string][]string{}, termErrors: s.termErrors, base: base, last: last, peak: peak, scrapeErr: scrapeErr,
		logs: logCounts(opt.dir, "generation started", "commit failed", "consumer group generation failed")}
	for _, sc := range s.scorers {
		if e := sc.unasked(); len(e) > 0 {
			o.exits[sc.name] = e
		}
	}
	line, broken := verdict(opt, o)
	if prodErrs > 0 {
		s.logf("producer: %d sends not acknowledged (sent again), the last: %v", prodErrs, prodLastErr)
	}
	for _, b := range broken {
		s.logf("BROKEN: %s", b)
	}
	s.logf("logs and broker data in %s", opt.dir)
	return line, len(broken) == 0, nil
}
