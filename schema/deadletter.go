package schema

import (
	"strconv"
	"time"
)

// Header names written on dead letters. The __connect.errors.* names are the
// ones Kafka Connect's DeadLetterQueueReporter uses (errors.deadletterqueue.
// context.headers.enable=true), so existing DLQ tooling can read and replay
// scorer's DLQ; HeaderDLQReason adds scorer's own low-cardinality code.
const (
	HeaderErrorsTopic          = "__connect.errors.topic"
	HeaderErrorsPartition      = "__connect.errors.partition"
	HeaderErrorsOffset         = "__connect.errors.offset"
	HeaderErrorsStage          = "__connect.errors.stage"
	HeaderErrorsExceptionClass = "__connect.errors.exception.class.name"
	HeaderErrorsExceptionMsg   = "__connect.errors.exception.message"
	HeaderDLQReason            = "scorer.dlq.reason"
)

// Header names written on output records. HeaderModelSHA256 carries the ONNX
// file hash (the model version) so consumers can filter or reprocess by
// model without parsing the value; HeaderContentSHA256 is the hex SHA-256 of
// the exact record value bytes, so a consumer can verify integrity and
// detect byte-identical redeliveries.
const (
	HeaderModelSHA256   = "scorer.model.sha256"
	HeaderContentSHA256 = "scorer.content.sha256"
	// HeaderSourceOffset and HeaderSourceGeneration say which input record
	// (its partition is in HeaderSourcePartition) and which consumer-group
	// generation wrote a result or row, so that a sink can drop stale
	// writes: a write whose source offset is below the one it stored for
	// the key, or whose generation is below the highest it has seen for
	// that input partition, comes from work the scorer had abandoned (see
	// docs/reliability.md). Dead letters carry HeaderSourceGeneration beside
	// the __connect.errors.* coordinates.
	HeaderSourceTopic      = "scorer.source.topic"
	HeaderSourcePartition  = "scorer.source.partition"
	HeaderSourceOffset     = "scorer.source.offset"
	HeaderSourceGeneration = "scorer.source.generation"
)

// Stage values for DeadLetter.Stage, following Connect's Stage enum names
// where one fits so DLQ tooling groups them sensibly.
const (
	// StageDecode: the record value could not be decoded (Connect's
	// VALUE_CONVERTER stage).
	StageDecode = "VALUE_CONVERTER"
	// StageScore: scoring failed after retries (Connect's TASK_PUT stage,
	// the sink task's processing step).
	StageScore = "TASK_PUT"
	// StageProduce: the result could not be produced (e.g. too large).
	StageProduce = "KAFKA_PRODUCE"
)

// Header is one Kafka record header. It mirrors kafka-go's Header without
// importing it, because schema stays free of Kafka client types.
type Header struct {
	Key   string `json:"key"`
	Value []byte `json:"value"`
}

// DeadLetter is an input record that could not be scored, plus why. Key,
// Value, Headers and Timestamp are the original record's, untouched, so the
// record can be replayed as is; Topic/Partition/Offset locate the original;
// Stage, Reason, ExceptionClass and Message explain the failure.
type DeadLetter struct {
	Key       []byte    `json:"key"`
	Value     []byte    `json:"value"`
	Headers   []Header  `json:"headers"`
	Timestamp time.Time `json:"timestamp"`
	Topic     string    `json:"topic"`
	Partition int       `json:"partition"`
	Offset    int64     `json:"offset"`
	// Generation is the consumer-group generation that wrote the dead
	// letter (0: unknown, no header).
	Generation     int32  `json:"generation,omitempty"`
	Stage          string `json:"stage"`
	Reason         string `json:"reason"`
	ExceptionClass string `json:"exception_class"`
	Message        string `json:"message"`
}

// errorHeaderNames is a read-only set of the headers ErrorHeaders writes.
var errorHeaderNames = map[string]bool{
	HeaderErrorsTopic: true, HeaderErrorsPartition: true, HeaderErrorsOffset: true,
	HeaderErrorsStage: true, HeaderErrorsExceptionClass: true, HeaderErrorsExceptionMsg: true,
	HeaderDLQReason: true, HeaderSourceGeneration: true,
}

// ErrorHeaders returns the headers for the DLQ record: the original headers
// first, in order, then the __connect.errors.* headers and scorer.dlq.reason.
// Original headers that already use one of those names (a record that was
// dead-lettered before and replayed) are dropped, because readers typically
// take the first header with a name and would otherwise see the stale error.
func (d DeadLetter) ErrorHeaders() []Header {
	out := make([]Header, 0, len(d.Headers)+len(errorHeaderNames))
	for _, h := range d.Headers {
		if !errorHeaderNames[h.Key] {
			out = append(out, h)
		}
	}
	if d.Generation > 0 {
		out = append(out, Header{Key: HeaderSourceGeneration, Value: []byte(strconv.Itoa(int(d.Generation)))})
	}
	return append(out,
		Header{Key: HeaderErrorsTopic, Value: []byte(d.Topic)},
		Header{Key: HeaderErrorsPartition, Value: []byte(strconv.Itoa(d.Partition))},
		Header{Key: HeaderErrorsOffset, Value: []byte(strconv.FormatInt(d.Offset, 10))},
		Header{Key: HeaderErrorsStage, Value: []byte(d.Stage)},
		Header{Key: HeaderErrorsExceptionClass, Value: []byte(d.ExceptionClass)},
		Header{Key: HeaderErrorsExceptionMsg, Value: []byte(d.Message)},
		Header{Key: HeaderDLQReason, Value: []byte(d.Reason)},
	)
}
