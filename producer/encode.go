package producer

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/segmentio/kafka-go"

	"github.com/scorer/scorer/schema"
)

// resultMessage encodes one ScoredTranscript for Topic.
func (p *Producer) resultMessage(st *schema.ScoredTranscript) (kafka.Message, error) {
	var value []byte
	var err error
	if p.cfg.Format == FormatConnect {
		value, err = schema.EnvelopeScoredTranscript(st)
	} else {
		value, err = schema.MarshalValue(st)
	}
	if err != nil {
		return kafka.Message{}, fmt.Errorf("producer: encode transcript %q: %w", st.CallID, err)
	}
	key, err := p.resultKey(st.CallID, st.EntityID, st.EventTime)
	if err != nil {
		return kafka.Message{}, err
	}
	return kafka.Message{
		Topic:   p.cfg.Topic,
		Key:     key,
		Value:   value,
		Headers: outputHeaders(st.Model.SHA256, value, st.Source),
	}, nil
}

// resultKey is the key of a call's result (and tombstone): call_id, or
// under KeyEntityEvent the EventKey as JSON (a JsonConverter envelope with
// FormatConnect, the struct key a JDBC sink's pk.mode=record_key reads).
func (p *Producer) resultKey(callID, entityID, eventTime string) ([]byte, error) {
	if p.cfg.Key != KeyEntityEvent {
		return []byte(callID), nil
	}
	k, err := schema.NewEventKey(callID, entityID, eventTime)
	if err != nil {
		return nil, fmt.Errorf("producer: %w", err)
	}
	var key []byte
	if p.cfg.Format == FormatConnect {
		key, err = schema.EnvelopeEventKey(k)
	} else {
		key, err = json.Marshal(k)
	}
	if err != nil {
		return nil, fmt.Errorf("producer: encode key of %q: %w", callID, err)
	}
	return key, nil
}

// rowMessage encodes one ScoreRow for RowsTopic, keyed by its RowKey so a
// JDBC sink can upsert (pk.mode=record_key).
func (p *Producer) rowMessage(r *schema.ScoreRow, modelSHA string, src *schema.Source) (kafka.Message, error) {
	var key, value []byte
	var err error
	switch {
	case p.cfg.Key == KeyEntityEvent:
		var k schema.EventRowKey
		if k, err = r.EventRowKey(); err != nil {
			return kafka.Message{}, fmt.Errorf("producer: %w", err)
		}
		if p.cfg.Format == FormatConnect {
			key, err = schema.EnvelopeEventRowKey(k)
		} else {
			key, err = json.Marshal(k)
		}
	case p.cfg.Format == FormatConnect:
		key, err = schema.EnvelopeRowKey(r.Key())
	default:
		key, err = json.Marshal(r.Key())
	}
	if err == nil {
		if p.cfg.Format == FormatConnect {
			value, err = schema.EnvelopeScoreRow(r)
		} else {
			value, err = schema.MarshalValue(r)
		}
	}
	if err != nil {
		return kafka.Message{}, fmt.Errorf("producer: encode row %s/%s/%d/%s: %w", r.CallID, r.Section, r.SentenceIndex, r.Label, err)
	}
	return kafka.Message{Topic: p.cfg.RowsTopic, Key: key, Value: value, Headers: outputHeaders(modelSHA, value, src)}, nil
}

// outputHeaders returns the model hash, the SHA-256 of value, the exact
// bytes written (not the input record: the producer never sees it, and a hash
// of the output lets a reader verify what it got), and, when src is known,
// the input record and generation it came from, so that a sink can drop
// stale writes without parsing the value (rows carry no source field), and
// last the input record's trace context, so a trace crosses the scorer.
func outputHeaders(modelSHA string, value []byte, src *schema.Source) []kafka.Header {
	sum := sha256.Sum256(value)
	hs := []kafka.Header{
		{Key: schema.HeaderModelSHA256, Value: []byte(modelSHA)},
		{Key: schema.HeaderContentSHA256, Value: []byte(hex.EncodeToString(sum[:]))},
	}
	if src != nil {
		hs = append(hs,
			kafka.Header{Key: schema.HeaderSourceTopic, Value: []byte(src.Topic)},
			kafka.Header{Key: schema.HeaderSourcePartition, Value: []byte(strconv.Itoa(src.Partition))},
			kafka.Header{Key: schema.HeaderSourceOffset, Value: []byte(strconv.FormatInt(src.Offset, 10))},
			kafka.Header{Key: schema.HeaderSourceGeneration, Value: []byte(strconv.Itoa(int(src.Generation)))})
		hs = append(hs, kafkaHeaders(src.Trace)...)
	}
	return hs
}

func kafkaHeaders(hs []schema.Header) []kafka.Header {
	out := make([]kafka.Header, len(hs))
	for i, h := range hs {
		out[i] = kafka.Header{Key: h.Key, Value: h.Value}
	}
	return out
}

// recordSize is an upper bound of the size kafka-go checks against
// BatchBytes (its Message.totalSize): fixed fields plus key, value and
// headers, with generous varint overheads.
func recordSize(m kafka.Message) int64 {
	n := int64(4+1+1+8) + 4 + int64(len(m.Key)) + 4 + int64(len(m.Value)) + 5
	for _, h := range m.Headers {
		n += 10 + int64(len(h.Key)) + int64(len(h.Value))
	}
	return n
}

// checkSize rejects a record larger than its topic accepts (see
// Config.TopicMaxBytes) before it is sent, so the caller gets a
// *PermanentError naming it rather than a whole failed call.
func (p *Producer) checkSize(m kafka.Message) error {
	if n, limit := recordSize(m), p.cfg.recordLimit(m.Topic); n > limit {
		return fmt.Errorf("producer: record for %s is about %d bytes, limit %d: %w", m.Topic, n, limit, kafka.MessageSizeTooLarge)
	}
	return nil
}
