package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/segmentio/kafka-go"
)

func runProduce(ctx context.Context, e procEnv, args []string) error {
	fs := flag.NewFlagSet("produce", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	brokers := fs.String("brokers", e.getenv("KAFKA_BROKERS"), "comma-separated brokers (env KAFKA_BROKERS)")
	topic := fs.String("topic", envOr(e.getenv, "KAFKA_INPUT_TOPIC", "transcripts"), "topic (env KAFKA_INPUT_TOPIC)")
	file := fs.String("file", "-", "TranscriptEvent JSONL file; - = stdin")
	limit := fs.Int("limit", 0, "produce at most this many lines; 0 = all")
	rate := fs.Float64("rate", 0, "records per second; 0 = as fast as the broker takes them")
	if err := fs.Parse(args); err != nil {
		return errUsage
	}
	if *brokers == "" {
		return errors.New("produce: --brokers (or KAFKA_BROKERS) is required")
	}
	var in io.Reader = e.stdin
	if *file != "-" {
		f, err := os.Open(*file)
		if err != nil {
			return fmt.Errorf("produce: %w", err)
		}
		defer f.Close()
		in = f
	}
	w := &kafka.Writer{
		Addr:                   kafka.TCP(splitList(*brokers, ",")...),
		Topic:                  *topic,
		Balancer:               &kafka.Hash{},
		RequiredAcks:           kafka.RequireAll,
		BatchTimeout:           5 * time.Millisecond,
		BatchBytes:             64 << 20,
		Compression:            kafka.Lz4,
		AllowAutoTopicCreation: true,
	}
	defer w.Close()
	n, err := produceLines(ctx, w, in, *limit, *rate)
	fmt.Fprintf(e.stdout, "produced %d records to %s\n", n, *topic)
	return err
}

// produceLines writes each non-empty line as one record, keyed by its
// call_id when the line has one. Lines go out unvalidated on purpose: the
// scorer, not the loader, decides what is bad input.
func produceLines(ctx context.Context, w *kafka.Writer, in io.Reader, limit int, rate float64) (int, error) {
	r := bufio.NewReaderSize(in, 1<<20)
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
		line, err := r.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 {
			value := bytes.TrimRight(line, "\r\n")
			if tick != nil {
				// Wait first, so the record's timestamp is when it is sent and
				// end-to-end latency measured from it is not inflated by pacing.
				select {
				case <-ctx.Done():
					return n, ctx.Err()
				case <-tick.C:
				}
			}
			batch = append(batch, kafka.Message{Key: eventKey(value), Value: value, Time: time.Now()})
			if tick != nil {
				if ferr := flush(); ferr != nil {
					return n, ferr
				}
			} else if len(batch) >= chunk {
				if ferr := flush(); ferr != nil {
					return n, ferr
				}
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return n, fmt.Errorf("produce: read: %w", err)
		}
	}
	return n, flush()
}

// eventKey extracts call_id (or the seed's CALL_ID) for the record key, so
// that all versions of one call land on one partition.
func eventKey(value []byte) []byte {
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

func envOr(getenv func(string) string, key, def string) string {
	if v := getenv(key); v != "" {
		return v
	}
	return def
}
