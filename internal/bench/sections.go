package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/scorer/scorer/internal/config"
	"github.com/scorer/scorer/internal/produce"
	"github.com/scorer/scorer/internal/scoring"
	"github.com/scorer/scorer/model"
	"github.com/scorer/scorer/schema"
)

// tokenizerResult is the tokenizer's speed over a set of sentences.
type tokenizerResult struct {
	Sentences    int     `json:"sentences"`
	Tokens       int     `json:"tokens"`
	Seconds      float64 `json:"seconds"`
	TokensPerSec float64 `json:"tokens_per_sec"`
}

// timeTokenizer encodes every sentence of the events once, single-threaded,
// as TranscriptScorer.Score does (hypotheses are encoded once at start and
// not counted).
func timeTokenizer(m *model.Model, evs []schema.TranscriptEvent) (tokenizerResult, error) {
	var r tokenizerResult
	t0 := time.Now()
	for i := range evs {
		for _, sents := range evs[i].Sections {
			for _, s := range sents {
				ids, err := m.Tokenizer.Encode(s)
				if err != nil {
					return r, err
				}
				r.Tokens += len(ids)
				r.Sentences++
			}
		}
	}
	r.Seconds = time.Since(t0).Seconds()
	if r.Seconds > 0 {
		r.TokensPerSec = float64(r.Tokens) / r.Seconds
	}
	return r, nil
}

// scalingPoint is scoring throughput at one thread/worker setting.
type scalingPoint struct {
	Threads     int     `json:"intra_op_threads"`
	Workers     int     `json:"workers"`
	Pairs       int     `json:"pairs"`
	PairsPerSec float64 `json:"pairs_per_sec"`
}

// runScaling scores the same events through a CPU pool (TranscriptScorer,
// tokenization included, no Kafka) at each threads × workers setting. Kafka
// is left out because it does not change with these settings and would only
// add noise and minutes.
func runScaling(ctx context.Context, rt *scoring.Runtime, cfg config.Config, m *model.Model, evs []schema.TranscriptEvent, threads, workers []int, rounds int) ([]scalingPoint, error) {
	var out []scalingPoint
	// Settings are measured in interleaved rounds and each keeps its best
	// round: on a shared machine another tenant's burst then spoils one
	// round of a setting rather than the whole setting.
	for round := range rounds {
		i := 0
		for _, t := range threads {
			for _, w := range workers {
				// The service's CPU pool with these threads and workers.
				c := cfg
				c.CPUThreads, c.Workers = t, w
				cs, err := newCPUScorer(ctx, rt, c, m, nil)
				if err != nil {
					return nil, err
				}
				ts := cs.plain
				// Warm-up on the smallest event, so first-run allocation
				// in ORT is not charged to one setting.
				_, err = ts.Score(ctx, evs[:1])
				var d time.Duration
				if err == nil {
					t0 := time.Now()
					_, err = ts.Score(ctx, evs[1:])
					d = time.Since(t0)
				}
				cs.close()
				if err != nil {
					return nil, fmt.Errorf("bench: scaling threads=%d workers=%d: %w", t, w, err)
				}
				pairs := 0
				for i := range evs[1:] {
					pairs += ts.PairCount(&evs[1+i])
				}
				pt := scalingPoint{Threads: t, Workers: w, Pairs: pairs, PairsPerSec: float64(pairs) / d.Seconds()}
				if round == 0 {
					out = append(out, pt)
				} else if pt.PairsPerSec > out[i].PairsPerSec {
					out[i] = pt
				}
				i++
			}
		}
	}
	return out, nil
}

// memoryPoint is the scorer process's peak RSS with one backlog size.
type memoryPoint struct {
	Multiple   int     `json:"backlog_multiple"`
	Backlog    int     `json:"backlog_records"`
	PeakRSSMiB float64 `json:"peak_rss_mib"`
	Fetched    int     `json:"records_fetched"`
	Scored     int     `json:"records_scored"`
	Seconds    float64 `json:"seconds"`
}

// runMemory loads a backlog into `scorer broker` (child process) first,
// then runs `scorer run` (another child) against it for a fixed time and
// reads its VmHWM. The backlog is in the topic before the scorer starts, so
// an unbounded fetch would show up as RSS growing with the backlog.
func runMemory(ctx context.Context, cfg config.Config, modelDir string, corpus []corpusLine, backlog, multiple int, d time.Duration) (memoryPoint, error) {
	mp := memoryPoint{Multiple: multiple, Backlog: backlog}
	broker, addr, err := startBrokerChild(ctx, cfg.InputPartitions)
	if err != nil {
		return mp, err
	}
	defer broker.stop(2 * time.Second)
	recs, err := repeatCorpus(corpus, backlog)
	if err != nil {
		return mp, err
	}
	w := produce.NewInputWriter([]string{addr}, cfg.InputTopic, nil)
	w.BatchTimeout = time.Millisecond
	msgs := make([]kafka.Message, 0, 64)
	for i, r := range recs {
		msgs = append(msgs, kafka.Message{Key: produce.EventKey(r), Value: r})
		if len(msgs) == cap(msgs) || i == len(recs)-1 {
			if err := w.WriteMessages(ctx, msgs...); err != nil {
				_ = w.Close()
				return mp, fmt.Errorf("bench: memory backlog: %w", err)
			}
			msgs = msgs[:0]
		}
	}
	_ = w.Close()

	lib, err := config.ResolvePath(cfg.ORTLib)
	if err != nil {
		return mp, err
	}
	metricsAddr, err := freePort()
	if err != nil {
		return mp, err
	}
	env := []string{
		"KAFKA_BROKERS=" + addr, "MODEL_DIR=" + modelDir, "ORT_LIB=" + lib, "METRICS_ADDR=" + metricsAddr,
		"LOG_LEVEL=warn", "LOG_FORMAT=json", "SHUTDOWN_TIMEOUT=2s",
		"DEVICE=" + cfg.Device, "CPU_THREADS=" + strconv.Itoa(cfg.CPUThreads),
		"BATCH_MAX_MESSAGES=" + strconv.Itoa(cfg.BatchMaxMessages), "MAX_INFLIGHT_BATCHES=" + strconv.Itoa(cfg.MaxInflightBatches),
		"BATCH_MAX_WAIT=" + cfg.BatchMaxWait.String(), "KAFKA_INPUT_TOPIC=" + cfg.InputTopic,
	}
	sc, err := startChild(env, nil, "run")
	if err != nil {
		return mp, err
	}
	defer sc.stop(5 * time.Second)
	t0 := time.Now()
	stopPeak := watchPeak(sc.cmd.Process.Pid, 100*time.Millisecond)
	select {
	case <-ctx.Done():
		stopPeak()
		return mp, ctx.Err()
	case <-sc.done:
		stopPeak()
		return mp, fmt.Errorf("bench: scorer exited early: %s", sc.log.String())
	case <-time.After(d):
	}
	mp.Seconds = time.Since(t0).Seconds()
	if text, err := httpGet(ctx, "http://"+metricsAddr+"/metrics"); err == nil {
		mp.Fetched = int(scrapeMetric(text, "scorer_messages_in_total"))
		mp.Scored = int(scrapeMetric(text, "scorer_messages_out_total"))
	}
	// The last reading right before stopping: VmHWM only ever grows.
	mp.PeakRSSMiB = float64(stopPeak()) / 1024
	return mp, nil
}

func httpGet(ctx context.Context, url string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}
