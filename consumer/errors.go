package consumer

import (
	"errors"
	"fmt"

	"github.com/segmentio/kafka-go"
)

// PermanentError is a Sink error that retrying cannot fix (an output record
// too large for the broker, say): the inputs behind it go to the DLQ instead
// of being retried forever. Sinks that cannot import this package can
// return any error with a `Permanent() bool` method instead; this type is
// the ready-made one.
type PermanentError struct {
	// Indexes are the positions, in the slice given to Publish, of the
	// records that failed; every other record was acknowledged. Empty means
	// unknown, and the consumer then republishes the records one by one to
	// find the failing ones.
	Indexes []int
	Err     error
}

// Error describes the failure.
func (e *PermanentError) Error() string {
	return fmt.Sprintf("consumer: permanent sink error (records %v): %v", e.Indexes, e.Err)
}

// Unwrap returns the cause.
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent marks the error as not worth retrying.
func (e *PermanentError) Permanent() bool { return true }

// FailedIndexes returns Indexes, the optional interface the consumer checks
// to dead-letter exactly the failed records.
func (e *PermanentError) FailedIndexes() []int { return e.Indexes }

// IsPermanent reports whether err says retrying cannot help: it or an error
// it wraps has a Permanent() method returning true, or it is kafka-go's
// message-too-large error.
func IsPermanent(err error) bool {
	var p interface{ Permanent() bool }
	if errors.As(err, &p) && p.Permanent() {
		return true
	}
	var tooLarge kafka.MessageTooLargeError
	return errors.As(err, &tooLarge) || errors.Is(err, kafka.MessageSizeTooLarge)
}

// failedIndexes returns the record positions a permanent error names, or
// nil when it does not say.
func failedIndexes(err error) []int {
	var f interface{ FailedIndexes() []int }
	if errors.As(err, &f) {
		return f.FailedIndexes()
	}
	return nil
}

// isTooLarge reports whether err says a record exceeded a size limit.
func isTooLarge(err error) bool {
	var tooLarge kafka.MessageTooLargeError
	return errors.As(err, &tooLarge) || errors.Is(err, kafka.MessageSizeTooLarge)
}
