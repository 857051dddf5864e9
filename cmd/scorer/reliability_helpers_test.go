package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/scorer/scorer/internal/testenv"
	"github.com/scorer/scorer/producer"
	"github.com/scorer/scorer/schema"
)

// smallEvents writes n small TranscriptEvents built from real corpus
// sentences (1–3 sentences of 40–160 bytes each, one FILT_MD section) to a
// JSONL file, call_ids REL-00000…, and returns the file and the call_ids.
// Scoring on two CPU cores runs at a few hundred pairs a second, so
// thousands of whole transcripts would not fit a test; real short sentences
// keep the text real and the volume large.
func smallEvents(t testing.TB, n int, prefix string) (string, []string) {
	t.Helper()
	sents := corpusSentences(t, 40, 160)
	var buf bytes.Buffer
	ids := make([]string, n)
	k := 0
	for i := range n {
		m := 1 + i%3
		ss := make([]string, m)
		for j := range ss {
			ss[j] = sents[k%len(sents)]
			k++
		}
		ids[i] = fmt.Sprintf("%s-%05d", prefix, i)
		ev := map[string]any{
			"call_id": ids[i], "entity_id": "REL", "company_name": "Reliability Drill Inc.",
			"event_time": "2024-02-20T13:00:00Z", "version_id": "1",
			"sections": map[string][]string{"FILT_MD": ss},
		}
		b, err := json.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		buf.Write(b)
		buf.WriteByte('\n')
	}
	path := filepath.Join(t.TempDir(), prefix+".jsonl")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path, ids
}

// corpusSentences is every distinct corpus sentence whose length is in
// [minLen, maxLen] bytes, in corpus order (testenv decodes the corpus once
// per process). The slice is shared: do not modify it.
func corpusSentences(t testing.TB, minLen, maxLen int) []string {
	t.Helper()
	sents := testenv.CorpusSentences(t, minLen, maxLen)
	if len(sents) < 1000 {
		t.Fatalf("only %d short corpus sentences", len(sents))
	}
	return sents
}

// createOutputTopics creates the scorer's output and DLQ topics with room
// for the largest records its default limits allow, as `scorer broker`
// does: a test reading them before the scorer starts would otherwise have
// the broker auto-create them at its 1 MiB default, which the scorer
// refuses at start.
func createOutputTopics(t testing.TB, broker string, partitions int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	big := map[string]string{"max.message.bytes": strconv.Itoa(128 << 20)}
	if err := producer.EnsureTopics(ctx, []string{broker}, nil, producer.TopicSpec{Name: "transcripts.scored", Partitions: partitions, Configs: big},
		producer.TopicSpec{Name: "transcripts.dlq", Partitions: 1, Configs: big}); err != nil {
		t.Fatal(err)
	}
}

// topicWatch reads every partition of a topic from the start in the
// background and keeps every record, so a test can wait on what has
// arrived so far while the scorer keeps working.
type topicWatch struct {
	broker, topic string
	cancel        context.CancelFunc
	wg            sync.WaitGroup

	mu   sync.Mutex
	msgs []kafka.Message
	next map[int]int64 // per partition: offset after the last record read
}

func watchTopic(t testing.TB, broker, topic string, dialer *kafka.Dialer) *topicWatch {
	t.Helper()
	if dialer == nil {
		dialer = kafka.DefaultDialer
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := &topicWatch{broker: broker, topic: topic, cancel: cancel, next: map[int]int64{}}
	parts := partitionsOf(t, broker, topic, dialer)
	for _, p := range parts {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			r := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{broker}, Topic: topic, Partition: p,
				MaxBytes: 64 << 20, MaxWait: 100 * time.Millisecond, Dialer: dialer})
			defer r.Close()
			for {
				m, err := r.ReadMessage(ctx)
				if err != nil {
					if ctx.Err() != nil {
						return
					}
					time.Sleep(100 * time.Millisecond)
					continue
				}
				w.mu.Lock()
				w.msgs = append(w.msgs, m)
				w.next[p] = m.Offset + 1
				w.mu.Unlock()
			}
		}()
	}
	t.Cleanup(w.stop)
	return w
}

func (w *topicWatch) stop() {
	w.cancel()
	w.wg.Wait()
}

func (w *topicWatch) snapshot() []kafka.Message {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]kafka.Message(nil), w.msgs...)
}

func (w *topicWatch) len() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.msgs)
}

// distinctKeys counts the distinct record keys read so far.
func (w *topicWatch) distinctKeys() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	seen := make(map[string]struct{}, len(w.msgs))
	for _, m := range w.msgs {
		seen[string(m.Key)] = struct{}{}
	}
	return len(seen)
}

// waitKeys waits until n distinct keys arrived, failing the test after
// timeout (the message says how far it got).
func (w *topicWatch) waitKeys(t testing.TB, n int, timeout time.Duration) {
	t.Helper()
	waitUntil(t, timeout, fmt.Sprintf("%d distinct keys on %s", n, w.topic), func() bool { return w.distinctKeys() >= n },
		func() string { return fmt.Sprintf("%d distinct of %d records", w.distinctKeys(), w.len()) })
}

// drain waits until every partition was read up to its current end, so a
// snapshot afterwards holds everything written so far.
func (w *topicWatch) drain(t testing.TB, dialer *kafka.Dialer, timeout time.Duration) {
	t.Helper()
	ends := endOffsets(t, w.broker, w.topic, dialer)
	waitUntil(t, timeout, "reading "+w.topic+" to its end", func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		for p, end := range ends {
			if end > 0 && w.next[p] < end {
				return false
			}
		}
		return true
	}, nil)
}

// waitUntil polls cond every 50ms until it holds or timeout passes.
func waitUntil(t testing.TB, timeout time.Duration, what string, cond func() bool, progress func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			msg := ""
			if progress != nil {
				msg = " (" + progress() + ")"
			}
			t.Fatalf("timed out after %v waiting for %s%s", timeout, what, msg)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func partitionsOf(t testing.TB, broker, topic string, dialer *kafka.Dialer) []int {
	t.Helper()
	if dialer == nil {
		dialer = kafka.DefaultDialer
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, err := dialer.DialContext(ctx, "tcp", broker)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ps, err := conn.ReadPartitions(topic)
	if err != nil {
		t.Fatalf("partitions of %s: %v", topic, err)
	}
	ids := make([]int, len(ps))
	for i, p := range ps {
		ids[i] = p.ID
	}
	sort.Ints(ids)
	return ids
}

// endOffsets is each partition's high-water mark.
func endOffsets(t testing.TB, broker, topic string, dialer *kafka.Dialer) map[int]int64 {
	t.Helper()
	if dialer == nil {
		dialer = kafka.DefaultDialer
	}
	out := map[int]int64{}
	for _, p := range partitionsOf(t, broker, topic, dialer) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		conn, err := dialer.DialLeader(ctx, "tcp", broker, topic, p)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		last, err := conn.ReadLastOffset()
		conn.Close()
		if err != nil {
			t.Fatal(err)
		}
		out[p] = last
	}
	return out
}

// committedOffsets is the group's committed offset per partition of topic
// (-1 where none).
func committedOffsets(t testing.TB, broker, group, topic string, parts []int) map[int]int64 {
	t.Helper()
	c := &kafka.Client{Addr: kafka.TCP(broker), Timeout: 10 * time.Second}
	var resp *kafka.OffsetFetchResponse
	var err error
	// A fault test may have just cut or paused the path to the broker, and a
	// coordinator may be mid-load: retry transient failures for a while.
	for deadline := time.Now().Add(30 * time.Second); ; {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err = c.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: parts}})
		cancel()
		if err == nil && resp.Error != nil {
			err = resp.Error
		}
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err != nil {
		t.Fatalf("offset fetch: %v", err)
	}
	out := map[int]int64{}
	for _, p := range resp.Topics[topic] {
		if p.Error != nil {
			t.Fatalf("offset fetch %s/%d: %v", topic, p.Partition, p.Error)
		}
		out[p.Partition] = p.CommittedOffset
	}
	return out
}

// waitCommittedToEnd waits until the group's commits reach the topic's end
// on every partition: everything was processed and nothing holds a gap.
func waitCommittedToEnd(t testing.TB, broker, group, topic string, timeout time.Duration) {
	t.Helper()
	ends := endOffsets(t, broker, topic, kafka.DefaultDialer)
	parts := make([]int, 0, len(ends))
	for p := range ends {
		parts = append(parts, p)
	}
	var last map[int]int64
	waitUntil(t, timeout, "committed offsets to reach the end of "+topic, func() bool {
		last = committedOffsets(t, broker, group, topic, parts)
		for p, end := range ends {
			if end > 0 && last[p] != end {
				return false
			}
		}
		return true
	}, func() string { return fmt.Sprintf("committed %v, ends %v", last, ends) })
}

// signalAndWait sends sig and waits for the process to exit; it returns
// how long the exit took and the exit error (nil = exit 0).
func signalAndWait(t testing.TB, p *scorerProcess, sig syscall.Signal, timeout time.Duration) (time.Duration, error) {
	t.Helper()
	start := time.Now()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v: %v", sig, err)
	}
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		return time.Since(start), err
	case <-time.After(timeout):
		_ = p.cmd.Process.Kill()
		t.Fatalf("scorer pid %d did not exit within %v of %v; log:\n%s", p.cmd.Process.Pid, timeout, sig, testenv.Tail(p.log.String(), 4000))
		return 0, nil
	}
}

// waitLog waits until the process log contains s.
func waitLog(t testing.TB, p *scorerProcess, s string, timeout time.Duration) {
	t.Helper()
	waitUntil(t, timeout, fmt.Sprintf("log line %q", s), func() bool { return strings.Contains(p.log.String(), s) },
		func() string { return testenv.Tail(p.log.String(), 2000) })
}

// sourceKey is where an output came from.
type sourceKey struct {
	partition int
	offset    int64
}

// outputsBySource decodes output records and groups them by source offset.
func outputsBySource(t testing.TB, msgs []kafka.Message) (map[sourceKey][]schema.ScoredTranscript, map[string]int) {
	t.Helper()
	bySrc := map[sourceKey][]schema.ScoredTranscript{}
	byCall := map[string]int{}
	for _, st := range decodeScored(t, msgs) {
		if st.Source == nil {
			t.Fatalf("%s: output without source", st.CallID)
		}
		k := sourceKey{st.Source.Partition, st.Source.Offset}
		bySrc[k] = append(bySrc[k], st)
		byCall[st.CallID]++
	}
	return bySrc, byCall
}

// produceSmallEvents writes n smallEvents to the input topic and returns
// their call_ids.
func produceSmallEvents(t testing.TB, broker string, n int, prefix string) []string {
	t.Helper()
	file, ids := smallEvents(t, n, prefix)
	if got := produceFile(t, broker, "transcripts", file); got != n {
		t.Fatalf("produced %d of %d", got, n)
	}
	return ids
}

// checkAllScored drains out and fails the test for every call_id in ids and
// every input offset without an output: the drills' no-loss check. It
// returns the outputs, grouped by source offset and counted per call_id.
func checkAllScored(t testing.TB, broker string, out *topicWatch, ids []string) ([]kafka.Message, map[sourceKey][]schema.ScoredTranscript, map[string]int) {
	t.Helper()
	out.drain(t, nil, 30*time.Second)
	msgs := out.snapshot()
	bySrc, byCall := outputsBySource(t, msgs)
	for _, id := range ids {
		if byCall[id] == 0 {
			t.Errorf("%s has no output", id)
		}
	}
	for p, end := range endOffsets(t, broker, "transcripts", nil) {
		for o := int64(0); o < end; o++ {
			if len(bySrc[sourceKey{p, o}]) == 0 {
				t.Errorf("input %d/%d has no output", p, o)
			}
		}
	}
	return msgs, bySrc, byCall
}

// relEnv is baseEnv plus a metrics server on a free port: baseEnv's empty
// METRICS_ADDR is read as unset (so the default :9464), which two scorer
// processes on one machine cannot share. The drills run nli-unigram-small,
// not ScorerEnv's DeBERTa: their sizes and bounds (inputs left to score at
// each kill or rebalance, a batch still running at SIGTERM, duplicates per
// commit interval) are calibrated on its speed, about 7× slower on the CPU,
// and its scores never reach THRESHOLD, so outputs carry no matches and stay
// the size the poison drill expects.
func relEnv(t testing.TB, kv ...string) map[string]string {
	return withEnv(testenv.ScorerEnv(t), append([]string{"METRICS_ADDR", "127.0.0.1:0", "MODEL_DIR", testenv.ModelDir(t, "nli-unigram-small")}, kv...)...)
}

// withEnv returns a copy of base with the given key=value pairs set.
func withEnv(base map[string]string, kv ...string) map[string]string {
	out := make(map[string]string, len(base)+len(kv)/2)
	for k, v := range base {
		out[k] = v
	}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i]] = kv[i+1]
	}
	return out
}
