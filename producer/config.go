package producer

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
)

// Output keys for Config.Key.
const (
	// KeyCallID keys results by call_id and rows by (call_id, section,
	// sentence_index, label): every version of a call replaces the last.
	KeyCallID = "call_id"
	// KeyEntityEvent keys results by (entity_id, event_time) and rows by
	// (entity_id, event_time, section, sentence_index, label), the seed
	// table's dedup on ENTITY_ID + EVENT_DATETIME_UTC: versions of one
	// company event replace each other even under different call_ids.
	// Records without both parts are rejected (*PermanentError).
	KeyEntityEvent = "entity_event"
)

// Output formats for Config.Format.
const (
	// FormatJSON writes plain JSON values.
	FormatJSON = "json"
	// FormatConnect writes Kafka Connect JsonConverter envelopes
	// (schemas.enable=true) so Connect sinks need no schema registry.
	FormatConnect = "connect"
)

// Defaults applied by Validate to zero fields.
const (
	// DefaultCompression trades a little CPU for much smaller transcripts
	// (repetitive JSON compresses well); snappy is supported by every Kafka
	// client and Connect worker.
	DefaultCompression = "snappy"
	// DefaultBatchSize is the most records per produce request; rows can
	// be hundreds per transcript.
	DefaultBatchSize = 1000
	// DefaultBatchBytes matches the broker's default message.max.bytes
	// (1 MiB + overhead), so a record the broker would reject is caught here
	// and reported as a *PermanentError instead of a retried broker error.
	DefaultBatchBytes = 1 << 20
	// DefaultWriteTimeout bounds one produce request.
	DefaultWriteTimeout = 10 * time.Second
)

// Config configures a Producer. Zero fields take the defaults above; call
// Validate (New does) before use. Config must not change after New.
type Config struct {
	// Brokers are the bootstrap broker addresses (host:port). Required.
	Brokers []string
	// Topic receives ScoredTranscripts. Required.
	Topic string
	// RowsTopic, when set, receives one ScoreRow per section × sentence ×
	// label, keyed by RowKey. Empty = off.
	RowsTopic string
	// DLQTopic receives dead letters. Required for DeadLetter.
	DLQTopic string
	// Format is FormatJSON (default) or FormatConnect; it applies to values
	// on Topic and to keys and values on RowsTopic. DLQ records are always
	// the original bytes.
	Format string
	// Key is KeyCallID (default) or KeyEntityEvent; it applies to results,
	// rows and tombstones alike.
	Key string
	// Compression is none, gzip, snappy (default), lz4 or zstd.
	Compression string
	// BatchSize is the most records per produce request; default 1000.
	BatchSize int
	// BatchBytes is the largest record (and batch) accepted; larger records
	// fail with a *PermanentError. Default 1 MiB; keep it ≤ the topics'
	// max.message.bytes.
	BatchBytes int64
	// WriteTimeout bounds one produce request; default 10s.
	WriteTimeout time.Duration
	// Transport carries TLS/SASL settings; nil uses kafka.DefaultTransport.
	Transport *kafka.Transport
	// ClientID is sent to brokers for quotas and logs; default "scorer".
	// When Transport is nil a Transport with this ClientID is created.
	ClientID string
	// AllowAutoTopicCreation lets the first write create missing topics
	// (dev and the in-memory broker only; production topics are managed).
	AllowAutoTopicCreation bool
}

// Validate applies defaults to zero fields and rejects bad settings before
// anything connects, so misconfiguration fails at startup.
func (c *Config) Validate() error {
	var errs []error
	if len(c.Brokers) == 0 {
		errs = append(errs, errors.New("no brokers"))
	}
	for _, b := range c.Brokers {
		if strings.TrimSpace(b) == "" {
			errs = append(errs, errors.New("empty broker address"))
		}
	}
	if c.Topic == "" {
		errs = append(errs, errors.New("no output topic"))
	}
	if c.DLQTopic == "" {
		errs = append(errs, errors.New("no DLQ topic"))
	}
	if c.Topic != "" && (c.Topic == c.DLQTopic || c.Topic == c.RowsTopic) {
		errs = append(errs, fmt.Errorf("topic %q is used for two outputs", c.Topic))
	}
	if c.RowsTopic != "" && c.RowsTopic == c.DLQTopic {
		errs = append(errs, fmt.Errorf("topic %q is used for rows and DLQ", c.RowsTopic))
	}
	switch c.Format {
	case "":
		c.Format = FormatJSON
	case FormatJSON, FormatConnect:
	default:
		errs = append(errs, fmt.Errorf("format %q: want %s or %s", c.Format, FormatJSON, FormatConnect))
	}
	switch c.Key {
	case "":
		c.Key = KeyCallID
	case KeyCallID, KeyEntityEvent:
	default:
		errs = append(errs, fmt.Errorf("key %q: want %s or %s", c.Key, KeyCallID, KeyEntityEvent))
	}
	if c.Compression == "" {
		c.Compression = DefaultCompression
	}
	if _, err := compression(c.Compression); err != nil {
		errs = append(errs, err)
	}
	if c.BatchSize < 0 || c.BatchBytes < 0 || c.WriteTimeout < 0 {
		errs = append(errs, errors.New("negative batch size, bytes or write timeout"))
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.BatchBytes == 0 {
		c.BatchBytes = DefaultBatchBytes
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = DefaultWriteTimeout
	}
	if c.ClientID == "" {
		c.ClientID = "scorer"
	}
	if len(errs) > 0 {
		return fmt.Errorf("producer: invalid config: %w", errors.Join(errs...))
	}
	return nil
}

func compression(name string) (kafka.Compression, error) {
	switch strings.ToLower(name) {
	case "none":
		return 0, nil
	case "gzip":
		return kafka.Gzip, nil
	case "snappy":
		return kafka.Snappy, nil
	case "lz4":
		return kafka.Lz4, nil
	case "zstd":
		return kafka.Zstd, nil
	default:
		return 0, fmt.Errorf("compression %q: want none, gzip, snappy, lz4 or zstd", name)
	}
}
