package produce

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"github.com/segmentio/kafka-go"

	"github.com/scorer/scorer/internal/config"
	"github.com/scorer/scorer/internal/scoring"
	"github.com/scorer/scorer/schema"
)

// demoOptions drives `make run`: load sample transcripts into the input
// topic, follow the output topic until each has a result, print a summary.
type demoOptions struct {
	file  string
	limit int
	cfg   config.Config
	sec   config.KafkaSecurity
	out   io.Writer
	stack *scoring.Stack
}

// RunDemo is `scorer run --demo-file`: it loads up to limit transcripts of
// file (0 = all) into cfg's input topic, follows the output topic until
// every record is handled (scored or dead-lettered) and prints a summary
// to out. It logs its own failure; run it in its own goroutine, ended by
// ctx.
func RunDemo(ctx context.Context, file string, limit int, cfg config.Config, sec config.KafkaSecurity, out io.Writer, stack *scoring.Stack, log zerolog.Logger) {
	o := demoOptions{file: file, limit: limit, cfg: cfg, sec: sec, out: out, stack: stack}
	if err := demo(ctx, o, log); err != nil && ctx.Err() == nil {
		log.Error().Err(err).Msg("demo failed")
	}
}

func demo(ctx context.Context, o demoOptions, log zerolog.Logger) error {
	f, err := os.Open(o.file)
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	defer f.Close()
	w := NewInputWriter(o.cfg.KafkaBrokers, o.cfg.InputTopic, o.sec.Transport(o.cfg.ClientID+"-demo"))
	defer w.Close()
	// Keep the sample's text so the summary can quote the best sentences:
	// results carry scores by position, and text only for matches.
	var sample bytes.Buffer
	texts := map[string]map[string][]string{}
	lines := schema.NewJSONLines(f, 64<<20)
	for o.limit <= 0 || len(texts) < o.limit {
		line, _, err := lines.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("demo: reading %s: %w", o.file, err)
		}
		// A line that does not decode still goes out: the scorer
		// dead-letters it, as it would any bad input.
		if ev, err := schema.DecodeEvent(line, o.stack.Limits); err == nil {
			texts[ev.CallID] = ev.Sections
		}
		sample.Write(line)
		sample.WriteByte('\n')
	}
	start := time.Now()
	n, err := ProduceLines(ctx, w, &sample, 0, 0)
	if err != nil {
		return err
	}
	log.Info().Int("transcripts", n).Str("topic", o.cfg.InputTopic).Msg("demo: sample transcripts loaded; scoring")

	// Done means every produced record was handled, whether scored or
	// dead-lettered (a bad or repeated line yields no new call_id): the
	// scorer's group has committed the input topic up to its end as of now,
	// and the output topic has been read up to its end as of that moment.
	cl := &kafka.Client{Addr: kafka.TCP(o.cfg.KafkaBrokers...), Timeout: 10 * time.Second, Transport: o.sec.Transport(o.cfg.ClientID + "-demo")}
	inEnd, err := topicOffsets(ctx, cl, o.cfg.InputTopic)
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers: o.cfg.KafkaBrokers, Topic: o.cfg.OutputTopic, GroupID: fmt.Sprintf("scorer-demo-%d", time.Now().UnixNano()),
		StartOffset: kafka.FirstOffset, MaxBytes: 64 << 20, Dialer: o.sec.Dialer(o.cfg.ClientID + "-demo"),
	})
	defer r.Close()
	sum := newDemoSummary(texts)
	next := map[int]int64{}                   // output offset to read next, per partition
	var outEnd map[int]kafka.PartitionOffsets // set once the input is all handled
	lastOutput, lastCheck := start, time.Time{}
	for outEnd == nil || !readTo(next, outEnd) {
		fctx, cancel := context.WithTimeout(ctx, demoPoll)
		m, err := r.FetchMessage(fctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err == nil:
			next[m.Partition] = m.Offset + 1
			var st schema.ScoredTranscript
			if err := DecodeOutput(m.Value, &st); err != nil {
				return fmt.Errorf("demo: output record: %w", err)
			}
			sum.add(&st)
			lastOutput = time.Now()
		case !errors.Is(err, context.DeadlineExceeded):
			return fmt.Errorf("demo: reading %s: %w", o.cfg.OutputTopic, err)
		}
		if outEnd != nil || time.Since(lastCheck) < demoPoll {
			continue
		}
		lastCheck = time.Now()
		handled, err := committedTo(ctx, cl, o.cfg.GroupID, o.cfg.InputTopic, inEnd)
		if err != nil {
			log.Debug().Err(err).Msg("demo: reading the scorer's committed offsets")
		}
		if handled {
			if outEnd, err = topicOffsets(ctx, cl, o.cfg.OutputTopic); err != nil {
				return fmt.Errorf("demo: %w", err)
			}
		}
	}
	elapsed := lastOutput.Sub(start)
	if elapsed <= 0 { // nothing scored: every line was dead-lettered
		elapsed = time.Since(start)
	}
	sum.print(o.out, elapsed, o.cfg.KafkaBrokers[0], o.stack)
	return nil
}

// demoPoll is how often the demo checks the scorer's progress.
const demoPoll = 500 * time.Millisecond

// topicOffsets is the first and end offset of every partition of topic.
func topicOffsets(ctx context.Context, cl *kafka.Client, topic string) (map[int]kafka.PartitionOffsets, error) {
	md, err := cl.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return nil, fmt.Errorf("metadata of %s: %w", topic, err)
	}
	var reqs []kafka.OffsetRequest
	for _, t := range md.Topics {
		if t.Error != nil {
			return nil, fmt.Errorf("metadata of %s: %w", topic, t.Error)
		}
		for _, p := range t.Partitions {
			reqs = append(reqs, kafka.FirstOffsetOf(p.ID), kafka.LastOffsetOf(p.ID))
		}
	}
	resp, err := cl.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
	if err != nil {
		return nil, fmt.Errorf("offsets of %s: %w", topic, err)
	}
	out := map[int]kafka.PartitionOffsets{}
	for _, p := range resp.Topics[topic] {
		if p.Error != nil {
			return nil, fmt.Errorf("offsets of %s partition %d: %w", topic, p.Partition, p.Error)
		}
		out[p.Partition] = p
	}
	return out, nil
}

// committedTo reports whether group has committed every partition of topic
// up to the end offsets in ends (empty partitions need no commit).
func committedTo(ctx context.Context, cl *kafka.Client, group, topic string, ends map[int]kafka.PartitionOffsets) (bool, error) {
	parts := make([]int, 0, len(ends))
	for p := range ends {
		parts = append(parts, p)
	}
	resp, err := cl.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: parts}})
	if err != nil {
		return false, err
	}
	if resp.Error != nil {
		return false, resp.Error
	}
	committed := map[int]int64{}
	for _, p := range resp.Topics[topic] {
		if p.Error == nil {
			committed[p.Partition] = p.CommittedOffset
		}
	}
	for p, e := range ends {
		if c, ok := committed[p]; e.LastOffset > e.FirstOffset && (!ok || c < e.LastOffset) {
			return false, nil
		}
	}
	return true, nil
}

// readTo reports whether next has reached every partition's end offset.
func readTo(next map[int]int64, ends map[int]kafka.PartitionOffsets) bool {
	for p, e := range ends {
		if e.LastOffset > e.FirstOffset && next[p] < e.LastOffset {
			return false
		}
	}
	return true
}

// DecodeOutput reads a ScoredTranscript in either output format (plain JSON or
// a Kafka Connect envelope), for the demo and for tests that read the output topic.
func DecodeOutput(b []byte, st *schema.ScoredTranscript) error {
	var envelope struct {
		Schema  json.RawMessage `json:"schema"`
		Payload json.RawMessage `json:"payload"`
	}
	if json.Unmarshal(b, &envelope) == nil && envelope.Schema != nil && envelope.Payload != nil {
		b = envelope.Payload
	}
	return json.Unmarshal(b, st)
}

type scoredSentence struct {
	score    float32
	call     string
	sentence string
}

type demoSummary struct {
	texts   map[string]map[string][]string
	calls   map[string]bool
	pairs   int
	labels  []string
	matches map[string]int
	top     map[string][]scoredSentence
}

func newDemoSummary(texts map[string]map[string][]string) *demoSummary {
	return &demoSummary{texts: texts, calls: map[string]bool{}, matches: map[string]int{}, top: map[string][]scoredSentence{}}
}

const demoTopN = 3

// add counts one output; a call seen before (a repeated line, or a
// redelivery) is counted once, by its first output.
func (s *demoSummary) add(st *schema.ScoredTranscript) {
	if s.calls[st.CallID] {
		return
	}
	s.calls[st.CallID] = true
	s.labels = st.Labels
	for _, name := range sortedKeys(st.Sections) {
		sec := st.Sections[name]
		s.pairs += sec.Sentences * len(st.Labels)
		for label, res := range sec.Results {
			s.matches[label] += len(res.Matches)
			for i, score := range res.Scores {
				t := s.top[label]
				if len(t) == demoTopN && score <= t[len(t)-1].score {
					continue
				}
				text := fmt.Sprintf("(%s sentence %d)", name, i)
				if sents := s.texts[st.CallID][name]; i < len(sents) {
					text = sents[i]
				}
				t = append(t, scoredSentence{score: score, call: st.CallID, sentence: text})
				sort.Slice(t, func(a, b int) bool { return t[a].score > t[b].score })
				if len(t) > demoTopN {
					t = t[:demoTopN]
				}
				s.top[label] = t
			}
		}
	}
}

// print writes the summary in one Write: whoever reads w while the demo
// runs (a test's buffer, a terminal shared with the log) sees all of it or
// none of it, never the header without the counts.
func (s *demoSummary) print(out io.Writer, elapsed time.Duration, broker string, stack *scoring.Stack) {
	w := &bytes.Buffer{}
	fmt.Fprintf(w, "\n=== scorer demo summary ===\n")
	fmt.Fprintf(w, "model        %s (sha256 %s…)\n", stack.Model.Name, stack.Model.SHA256[:12])
	if note, ok := standInNote(stack.Model.Dir); ok {
		fmt.Fprintf(w, "             a test stand-in (%s: %q): scores near chance, matches mean nothing\n", note.source, truncateText(note.text, 60))
		fmt.Fprintf(w, "             for real scores mount the production model's ONNX export and set MODEL_DIR to it (README, \"The production model\")\n")
	}
	fmt.Fprintf(w, "transcripts  %d\n", len(s.calls))
	fmt.Fprintf(w, "pairs        %d (sentences × %d labels)\n", s.pairs, len(s.labels))
	fmt.Fprintf(w, "throughput   %.0f pairs/s end to end (%s)\n", float64(s.pairs)/elapsed.Seconds(), elapsed.Truncate(time.Millisecond))
	fmt.Fprintf(w, "threshold    %.2f\n\n", stack.Labels.Threshold)
	for _, label := range s.labels {
		fmt.Fprintf(w, "%-40s %6d matches\n", label, s.matches[label])
		for _, t := range s.top[label] {
			fmt.Fprintf(w, "    %.4f  %-12s %s\n", t.score, t.call, truncateText(t.sentence, 100))
		}
	}
	fmt.Fprintf(w, "\nstill serving: produce more with `bin/scorer produce --brokers %s --file FILE`,\n", broker)
	fmt.Fprintf(w, "read results with `kcat -b %s -t transcripts.scored -C -e`; Ctrl-C to stop.\n", broker)
	_, _ = out.Write(w.Bytes())
}

// modelNote is what a model folder says about itself, and where.
type modelNote struct{ source, text string }

// standInWords mark a model folder's own description as a stand-in's: a
// model made for tests, or with random weights, whose scores say nothing.
var standInWords = regexp.MustCompile(`(?i)\b(random(ly initiali[sz]ed)? weights|for tests|tests and demos|not the production model|meaningless|stand-in)\b`)

// randomWeights is the one mark of a stand-in looked for past SOURCE.txt's
// first line: other words there ("not for tests") may be said of anything.
var randomWeights = regexp.MustCompile(`(?i)\brandom(ly initiali[sz]ed)? weights\b`)

// standInNote reports whether the model folder dir describes itself as a
// test stand-in, and with what words: config.json's "_note" (a key no
// exporter writes, which the stand-ins' makers add), else the first line of
// SOURCE.txt, else a later SOURCE.txt line that says its weights are random
// (a provenance file may open with the folder's name and purpose, as
// nli-deberta-v3-hf-tiny's does). A real export has neither, so it is never
// flagged.
func standInNote(dir string) (modelNote, bool) {
	var cfg struct {
		Note string `json:"_note"`
	}
	if b, err := os.ReadFile(filepath.Join(dir, "config.json")); err == nil && json.Unmarshal(b, &cfg) == nil && standInWords.MatchString(cfg.Note) {
		return modelNote{"config.json", cfg.Note}, true
	}
	if b, err := os.ReadFile(filepath.Join(dir, "SOURCE.txt")); err == nil {
		first := true
		for line := range strings.Lines(strings.TrimSpace(string(b))) {
			line = strings.TrimSpace(line)
			if first && standInWords.MatchString(line) || randomWeights.MatchString(line) {
				return modelNote{"SOURCE.txt", line}, true
			}
			first = false
		}
	}
	return modelNote{}, false
}

// truncateText shortens s to at most n runes for one-line display.
func truncateText(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
