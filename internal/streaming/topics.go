package streaming

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/rs/zerolog"

	"github.com/scorer/scorer/internal/config"
	"github.com/scorer/scorer/producer"
)

// topicPlan is what `scorer run` needs of its topics: the specs to create
// missing ones with, and the max.message.bytes each output topic must
// allow so that everything the input limits accept can be written.
type topicPlan struct {
	specs []producer.TopicSpec
	// result and row are the largest result and row (producer.Config's
	// MaxResultBytes, MaxRowBytes); dlq a full dead letter's.
	result, row, dlq int64
	shape            producer.OutputShape
}

// planTopics sizes the topics from the input limits (MAX_MESSAGE_BYTES,
// MAX_SENTENCES, MAX_SENTENCE_BYTES), the labels and pc's format: a topic
// the scorer creates gets a max.message.bytes that fits its largest record
// (the input topic: the largest record the scorer accepts). rf is the
// replication factor of created topics.
func planTopics(cfg config.Config, pc producer.Config, rf int) (topicPlan, error) {
	p := topicPlan{shape: producer.OutputShape{Limits: cfg.Limits(), Labels: cfg.Labels, Template: cfg.HypothesisTemplate,
		ScoreMode: cfg.ScoreMode, SourceTopic: cfg.InputTopic}}
	if err := pc.Validate(); err != nil {
		return p, err
	}
	var err error
	if p.result, err = pc.MaxResultBytes(p.shape); err != nil {
		return p, err
	}
	if p.row, err = pc.MaxRowBytes(p.shape); err != nil {
		return p, err
	}
	p.dlq = producer.MaxDeadLetterBytes(cfg.MaxMessageBytes)
	sized := func(name string, partitions int, record int64) producer.TopicSpec {
		return producer.TopicSpec{Name: name, Partitions: partitions, ReplicationFactor: rf,
			Configs: map[string]string{"max.message.bytes": strconv.FormatInt(pc.TopicBytes(record), 10)}}
	}
	p.specs = []producer.TopicSpec{
		sized(cfg.InputTopic, cfg.InputPartitions, p.dlq),
		sized(cfg.OutputTopic, cfg.InputPartitions, p.result),
		sized(cfg.DLQTopic, 1, p.dlq),
	}
	if cfg.RowsTopic != "" {
		p.specs = append(p.specs, sized(cfg.RowsTopic, cfg.InputPartitions, p.row))
	}
	return p, nil
}

// checkTopicLimits holds the output topics' max.message.bytes (limits, as
// the cluster reports them) to the plan: an output or rows topic too small
// for what the input limits accept is a configuration error naming both
// sides and both remedies, since otherwise the largest transcripts would
// be dead-lettered as output_too_large. A DLQ topic too small only costs
// the largest dead letters their value, which is logged.
func checkTopicLimits(cfg config.Config, pc producer.Config, p topicPlan, limits map[string]int64, log zerolog.Logger) error {
	var errs []string
	if have := limits[cfg.OutputTopic]; pc.RecordLimit(have) < p.result {
		msg := fmt.Sprintf("KAFKA_OUTPUT_TOPIC %s has max.message.bytes %d, but a transcript within MAX_MESSAGE_BYTES=%d and MAX_SENTENCES=%d scores, with %d labels in OUTPUT_FORMAT=%s, to a record of up to %s, which needs max.message.bytes >= %d: raise the topic's max.message.bytes to that (kafka-configs.sh --alter --entity-type topics --entity-name %s --add-config max.message.bytes=%d), or lower MAX_MESSAGE_BYTES",
			cfg.OutputTopic, have, cfg.MaxMessageBytes, cfg.MaxSentences, len(cfg.Labels), pc.Format, producer.SizeHint(p.result),
			pc.TopicBytes(p.result), cfg.OutputTopic, pc.TopicBytes(p.result))
		if m := fittingMessageBytes(cfg, pc, p.shape, pc.RecordLimit(have)); m > 0 {
			msg += fmt.Sprintf(" (at most %d fits this topic at MAX_SENTENCES=%d)", m, cfg.MaxSentences)
		} else {
			msg += " and MAX_SENTENCES (no MAX_MESSAGE_BYTES fits this topic at this MAX_SENTENCES)"
		}
		errs = append(errs, msg)
	}
	if cfg.RowsTopic != "" {
		if have := limits[cfg.RowsTopic]; pc.RecordLimit(have) < p.row {
			errs = append(errs, fmt.Sprintf("OUTPUT_ROWS_TOPIC %s has max.message.bytes %d, but a row (a sentence of up to MAX_SENTENCE_BYTES=%d) can be up to %s, which needs max.message.bytes >= %d: raise it, or lower MAX_SENTENCE_BYTES",
				cfg.RowsTopic, have, cfg.MaxSentenceBytes, producer.SizeHint(p.row), pc.TopicBytes(p.row)))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("config: %s", strings.Join(errs, "; "))
	}
	if have := limits[cfg.DLQTopic]; pc.RecordLimit(have) < p.dlq {
		log.Warn().Str("topic", cfg.DLQTopic).Int64("max_message_bytes", have).Int64("needed", pc.TopicBytes(p.dlq)).
			Msgf("KAFKA_DLQ_TOPIC is smaller than a dead letter of a MAX_MESSAGE_BYTES record: dead letters of records over about %s are written without their value (header %s); raise its max.message.bytes to %d to keep them",
				producer.SizeHint(pc.RecordLimit(have)), producer.HeaderDLQValueDropped, pc.TopicBytes(p.dlq))
	}
	log.Info().Int64("result_max_bytes", p.result).Int64("row_max_bytes", p.row).
		Int64("output_topic_max_message_bytes", limits[cfg.OutputTopic]).Int64("dlq_topic_max_message_bytes", limits[cfg.DLQTopic]).
		Msg("output topics fit every transcript the input limits accept")
	return nil
}

// fittingMessageBytes is the largest MAX_MESSAGE_BYTES whose largest result
// fits a record limit at cfg's other settings; 0 when none does.
func fittingMessageBytes(cfg config.Config, pc producer.Config, shape producer.OutputShape, limit int64) int {
	fits := func(m int) bool {
		shape.Limits.MaxMessageBytes = m
		n, err := pc.MaxResultBytes(shape)
		return err == nil && n <= limit
	}
	lo, hi := 0, cfg.MaxMessageBytes // fits(lo) once lo > 0; !fits(hi)
	for lo+1 < hi {
		if mid := lo + (hi-lo)/2; fits(mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	if lo > 0 && fits(lo) {
		return lo
	}
	return 0
}
