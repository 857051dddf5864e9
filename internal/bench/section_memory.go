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
)

// benchMemory is the memory section: the scorer process's peak RSS under
// backlogs of --memory-multiples × the in-flight limit.
func benchMemory(ctx context.Context, b *benchRun, f *folder) error {
	cfg, mr := f.cfg, f.mr
	limit := cfg.BatchMaxMessages * cfg.MaxInflightBatches
	for _, k := range b.multiples {
		progress(b.e, "%s: memory, backlog %d× in-flight limit (%d records), scorer process for %s", f.m.Name, k, k*limit, b.bf.memDuration)
		end := b.mt.begin("memory")
		mp, err := runMemory(ctx, cfg, f.dir, b.corpus, k*limit, k, b.bf.memDuration)
		end()
		if err != nil {
			return fmt.Errorf("memory: %w", err)
		}
		mr.Memory.Points = append(mr.Memory.Points, mp)
	}
	mr.Memory.InflightLimit = limit
	mr.Memory.MaxGrowth = memoryGrowthTarget.bound
	if n := len(mr.Memory.Points); n >= 2 {
		lo, hi := mr.Memory.Points[0].PeakRSSMiB, mr.Memory.Points[n-1].PeakRSSMiB
		mr.Memory.Growth = hi/lo - 1
		flat := memoryGrowthTarget.ok(mr.Memory.Growth)
		mr.Memory.Flat = &flat
	}
	return nil
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
