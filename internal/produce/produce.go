package produce

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/scorer/scorer/internal/cli"
	"github.com/scorer/scorer/internal/config"
	"github.com/scorer/scorer/schema"
	"github.com/segmentio/kafka-go"
)

// Spec is `scorer produce` for its help and the docs.
var Spec = cli.Spec{
	Name: "produce", Synopsis: "--brokers ADDR --file FILE [flags]",
	Summary: "load a TranscriptEvent JSONL file into a topic, keyed by call_id",
	About: "Load a TranscriptEvent JSONL file into a topic, one record per line, keyed by call_id, unvalidated " +
		"(the scorer decides what is bad input). It connects as `scorer run` does: the Kafka client and security " +
		"settings below (TLS, SASL) are the service's.",
	Settings: config.Produce,
	Flags:    func(fs *flag.FlagSet) { new(produceFlags).register(fs, func(string) string { return "" }) },
}

// produceFlags are `scorer produce`'s own flags; --brokers and --topic
// default to the service's KAFKA_BROKERS and KAFKA_INPUT_TOPIC.
type produceFlags struct {
	brokers, topic, file string
	limit                int
	rate                 float64
}

func (f *produceFlags) register(fs *flag.FlagSet, getenv func(string) string) {
	fs.StringVar(&f.brokers, "brokers", getenv("KAFKA_BROKERS"), "comma-separated brokers (env KAFKA_BROKERS)")
	fs.StringVar(&f.topic, "topic", envOr(getenv, "KAFKA_INPUT_TOPIC", "transcripts"), "topic (env KAFKA_INPUT_TOPIC)")
	fs.StringVar(&f.file, "file", "-", "TranscriptEvent JSONL file; - = stdin")
	fs.IntVar(&f.limit, "limit", 0, "produce at most this many lines; 0 = all")
	fs.Float64Var(&f.rate, "rate", 0, "records per second; 0 = as fast as the broker takes them")
}

// Command is `scorer produce`: load a TranscriptEvent JSONL file into a
// topic, over TLS and SASL when the KAFKA_TLS* and KAFKA_SASL* settings say
// so, as `scorer run` would connect.
func Command(ctx context.Context, e cli.Env, args []string) error {
	fs := Spec.FlagSet(e)
	var f produceFlags
	f.register(fs, e.Getenv)
	cfg, err := Spec.Load(e, fs, args)
	if err != nil {
		return err
	}
	if f.brokers == "" {
		return errors.New("produce: --brokers (or KAFKA_BROKERS) is required")
	}
	sec, err := config.NewKafkaSecurity(&cfg)
	if err != nil {
		return fmt.Errorf("produce: %w", err)
	}
	in, _, closeIn, err := OpenInput(f.file, e.Stdin)
	if err != nil {
		return fmt.Errorf("produce: %w", err)
	}
	defer closeIn()
	w := NewInputWriter(config.SplitList(f.brokers, ","), f.topic, sec.Transport(cfg.ClientID+"-produce"))
	defer w.Close()
	n, err := ProduceLines(ctx, w, in, f.limit, f.rate)
	fmt.Fprintf(e.Stdout, "produced %d records to %s\n", n, f.topic)
	return err
}

// NewInputWriter is the writer that loads TranscriptEvents into an input
// topic (produce, the demo, the bench and tests): acks from all replicas,
// keyed by call_id through the hash balancer so a call's versions stay in
// order on one partition, a short batch timeout because writes are
// synchronous, and room for large transcripts. transport may be nil.
func NewInputWriter(brokers []string, topic string, transport *kafka.Transport) *kafka.Writer {
	w := &kafka.Writer{
		Addr:                   kafka.TCP(brokers...),
		Topic:                  topic,
		Balancer:               &kafka.Hash{},
		RequiredAcks:           kafka.RequireAll,
		BatchTimeout:           5 * time.Millisecond,
		BatchBytes:             64 << 20,
		Compression:            kafka.Lz4,
		AllowAutoTopicCreation: true,
	}
	if transport != nil {
		w.Transport = transport
	}
	return w
}

// ProduceLines writes each non-empty line as one record, keyed by its
// call_id when the line has one. Lines go out unvalidated on purpose: the
// scorer, not the loader, decides what is bad input.
func ProduceLines(ctx context.Context, w *kafka.Writer, in io.Reader, limit int, rate float64) (int, error) {
	lines := schema.NewJSONLines(in, 0)
	const chunk = 64
	var batch []kafka.Message
	n := 0
	var tick *time.Ticker
	if rate > 0 {
		tick = time.NewTicker(time.Duration(float64(time.Second) / rate))
		defer tick.Stop()
	}
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		if err := w.WriteMessages(ctx, batch...); err != nil {
			return fmt.Errorf("produce: %w", err)
		}
		n += len(batch)
		batch = batch[:0]
		return nil
	}
	for limit <= 0 || n+len(batch) < limit {
		value, _, err := lines.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return n, fmt.Errorf("produce: read: %w", err)
		}
		if tick != nil {
			// Wait first, so the record's timestamp is when it is sent and
			// end-to-end latency measured from it is not inflated by pacing.
			select {
			case <-ctx.Done():
				return n, ctx.Err()
			case <-tick.C:
			}
		}
		batch = append(batch, kafka.Message{Key: EventKey(value), Value: value, Time: time.Now()})
		if tick != nil || len(batch) >= chunk {
			if ferr := flush(); ferr != nil {
				return n, ferr
			}
		}
	}
	return n, flush()
}

// EventKey extracts call_id (or the seed's CALL_ID) for the record key, so
// that all versions of one call land on one partition.
func EventKey(value []byte) []byte {
	var k struct {
		CallID  string `json:"call_id"`
		CallID2 string `json:"CALL_ID"`
	}
	if json.Unmarshal(value, &k) != nil {
		return nil
	}
	if k.CallID != "" {
		return []byte(k.CallID)
	}
	if k.CallID2 != "" {
		return []byte(k.CallID2)
	}
	return nil
}

// OpenInput opens path for reading, or returns stdin for "-". size is the
// file's size (0 for stdin), for progress estimates.
func OpenInput(path string, stdin io.Reader) (r io.Reader, size int64, closeFn func() error, err error) {
	if path == "-" {
		return stdin, 0, func() error { return nil }, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, nil, err
	}
	if st, err := f.Stat(); err == nil {
		size = st.Size()
	}
	return f, size, f.Close, nil
}

func envOr(getenv func(string) string, key, def string) string {
	if v := getenv(key); v != "" {
		return v
	}
	return def
}
