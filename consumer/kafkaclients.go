package consumer

import (
	"context"
	"errors"
	"net"
	"strconv"
	"time"

	"github.com/rs/zerolog"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	kgosasl "github.com/twmb/franz-go/pkg/sasl"
)

// The consumer speaks to Kafka through two client libraries, and this file
// is where they meet: what one Config says (brokers, client ID, dial
// timeout, TLS, SASL) reaches both from here, and both libraries' errors
// are told apart here.
//
//   - kafka-go's ConsumerGroup: membership, heartbeats, commits
//     (Consumer.Run, generation.go), and a kafka-go connection to a
//     partition's leader for its log bounds (checkOffset). The producer
//     uses kafka-go as well, and Config takes a *kafka.Dialer for it.
//   - franz-go (kgo): one client per partition per generation that fetches
//     it (fetcher.go), because kafka-go's Reader does not drop the records
//     of aborted transactions even when asked to read committed data
//     (segmentio/kafka-go#1332), and exactly-once producers (Flink, Kafka
//     Streams, Connect sources) abort transactions. kgo filters them with
//     the fetch response's aborted-transaction list and skips the control
//     records.

// defaultDialTimeout is the dial timeout of the kafka-go Dialer a Config
// without one gets.
const defaultDialTimeout = 10 * time.Second

// kafkaDialer is the kafka-go side of cfg's connection settings: Dialer,
// or kafka-go's defaults with ClientID when it is nil.
func (cfg Config) kafkaDialer() *kafka.Dialer {
	if cfg.Dialer != nil {
		return cfg.Dialer
	}
	return &kafka.Dialer{ClientID: cfg.ClientID, Timeout: defaultDialTimeout, DualStack: true}
}

// kgoConnOpts is the franz-go side of the same settings: the Dialer's
// ClientID, Timeout, TLS and SASLMechanism (its other fields, a DialFunc
// among them, do not cross).
func (cfg Config) kgoConnOpts() []kgo.Opt {
	d := cfg.kafkaDialer()
	opts := []kgo.Opt{kgo.SeedBrokers(cfg.Brokers...), kgo.ClientID(d.ClientID)}
	if d.Timeout > 0 {
		opts = append(opts, kgo.DialTimeout(d.Timeout))
	}
	if d.TLS != nil {
		opts = append(opts, kgo.DialTLSConfig(d.TLS.Clone()))
	}
	if d.SASLMechanism != nil {
		opts = append(opts, kgo.SASL(saslMechanism{d.SASLMechanism}))
	}
	return opts
}

// saslMechanism runs a kafka-go SASL mechanism (what Config.Dialer carries)
// in a kgo client: both drive the same challenge-response exchange.
type saslMechanism struct{ m sasl.Mechanism }

func (s saslMechanism) Name() string { return s.m.Name() }

func (s saslMechanism) Authenticate(ctx context.Context, host string) (kgosasl.Session, []byte, error) {
	if h, p, err := net.SplitHostPort(host); err == nil {
		port, _ := strconv.Atoi(p)
		ctx = sasl.WithMetadata(ctx, &sasl.Metadata{Host: h, Port: port})
	}
	sm, ir, err := s.m.Start(ctx)
	if err != nil {
		return nil, nil, err
	}
	return saslSession{ctx: ctx, sm: sm}, ir, nil
}

type saslSession struct {
	ctx context.Context
	sm  sasl.StateMachine
}

func (s saslSession) Challenge(challenge []byte) (bool, []byte, error) {
	return s.sm.Next(s.ctx, challenge)
}

// kgoLogger writes kgo's warnings and errors at warn level and the rest at
// debug level: a fetch client's own retries are not the operator's news.
type kgoLogger struct{ log zerolog.Logger }

func (l kgoLogger) Level() kgo.LogLevel {
	if l.log.GetLevel() <= zerolog.DebugLevel {
		return kgo.LogLevelInfo
	}
	return kgo.LogLevelWarn
}

func (l kgoLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	ev := l.log.Debug()
	if level <= kgo.LogLevelWarn {
		ev = l.log.Warn()
	}
	ev.Fields(keyvals).Msg("kgo: " + msg)
}

// isTooLarge reports whether err says a record exceeded a size limit, in
// either library's words: kafka-go's client-side MessageTooLargeError or
// the broker's MESSAGE_TOO_LARGE, which kafka-go and franz-go (kerr) each
// have a value for; kgo also fails a record over its own batch limit with
// kerr.MessageTooLarge.
func isTooLarge(err error) bool {
	var tooLarge kafka.MessageTooLargeError
	return errors.As(err, &tooLarge) || errors.Is(err, kafka.MessageSizeTooLarge) || errors.Is(err, kerr.MessageTooLarge)
}
