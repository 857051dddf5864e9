package producer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/segmentio/kafka-go"
)

// ErrClosed is returned by Publish and DeadLetter after Close.
var ErrClosed = errors.New("producer: closed")

// PermanentError reports records that can never be written as they are
// (too large for the broker even when sent alone, or not encodable), so
// retrying is pointless and the caller should dead-letter the corresponding
// inputs. Indexes are positions in the slice passed to Publish (or
// DeadLetter, where they name dead letters that failed even in minimal
// form); every other record of that call was written and acknowledged.
// CallIDs are the call_ids (for DeadLetter, the keys, shortened).
type PermanentError struct {
	Indexes []int
	CallIDs []string
	Err     error
}

// Error summarises the failed records.
func (e *PermanentError) Error() string {
	return fmt.Sprintf("producer: %d record(s) permanently rejected (call_ids %v): %v", len(e.Indexes), e.CallIDs, e.Err)
}

// Unwrap returns the first underlying cause (e.g. kafka.MessageSizeTooLarge).
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent reports true: the marker the consumer checks (through a small
// interface) to route inputs to the DLQ instead of retrying.
func (e *PermanentError) Permanent() bool { return true }

// FailedIndexes names the rejected records by their index in the Publish
// call, so the consumer dead-letters exactly those and not neighbours that
// were already acknowledged.
func (e *PermanentError) FailedIndexes() []int { return e.Indexes }

// errClass is the retry decision for one write error.
type errClass int

const (
	classTransient errClass = iota // retry with backoff
	classPermanent                 // this record can never succeed
	classFatal                     // stop and return (auth, config)
)

// classifyFor is classify for a message of the given metric kind. A dead
// letter keeps the input's original timestamp, which the broker may reject
// (INVALID_TIMESTAMP under message.timestamp.difference.max.ms or the
// before/after.max.ms rules): for a dead letter that is permanent, and the
// minimal form, stamped now, fixes it. Output records carry no timestamp
// of their own (kafka-go stamps them now), so for them it stays a
// configuration (fatal) error.
func classifyFor(kind string, err error) errClass {
	if kind == kindDLQ && errors.Is(err, kafka.InvalidTimestamp) {
		return classPermanent
	}
	return classify(err)
}

// isBatchRejection reports whether err is a broker error that rejects a
// whole partition batch because of what is in it (the batch is over
// max.message.bytes, or one record in it is invalid or badly timestamped).
// kafka-go reports it on every message of the batch, so it does not say
// that any one of them is bad until that message is sent alone. kafka-go's
// own up-front size check (MessageTooLargeError) names one message and is
// not included.
func isBatchRejection(err error) bool {
	var tooLarge kafka.MessageTooLargeError
	if errors.As(err, &tooLarge) {
		return false
	}
	return errors.Is(err, kafka.MessageSizeTooLarge) || errors.Is(err, kafka.InvalidRecord) ||
		errors.Is(err, kafka.RecordListTooLarge) || errors.Is(err, kafka.InvalidTimestamp)
}

// classify is the one place retry decisions are made, as kgo does in
// isRetryableBrokerErr.
func classify(err error) errClass {
	var tooLarge kafka.MessageTooLargeError
	switch {
	case errors.As(err, &tooLarge),
		errors.Is(err, kafka.MessageSizeTooLarge),
		errors.Is(err, kafka.InvalidRecord),
		errors.Is(err, kafka.RecordListTooLarge):
		// The record itself is the problem; retrying resends the same bytes.
		return classPermanent
	}
	var kerr kafka.Error
	if errors.As(err, &kerr) {
		if kerr.Temporary() {
			return classTransient
		}
		switch kerr {
		case kafka.RequestTimedOut, kafka.NotEnoughReplicas, kafka.NotEnoughReplicasAfterAppend,
			kafka.BrokerNotAvailable, kafka.OutOfOrderSequenceNumber:
			return classTransient
		}
		// Authorization, unsupported versions, invalid configs: retrying
		// cannot help and hides the problem.
		return classFatal
	}
	var netErr net.Error
	if errors.As(err, &netErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, net.ErrClosed) ||
		strings.Contains(err.Error(), "connection refused") || strings.Contains(err.Error(), "connection reset") {
		return classTransient
	}
	// Unknown errors are most often connection trouble; retrying under the
	// caller's ctx is the at-least-once choice (the input is not lost).
	return classTransient
}
