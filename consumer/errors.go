package consumer

import "errors"

// IsPermanent reports whether err says retrying cannot help: it or an error
// it wraps has a Permanent() method returning true, or it says a record is
// too large, in kafka-go's or franz-go's words (see isTooLarge). A Sink
// says which records of a Publish failed with an error that also has a
// FailedIndexes() []int method (positions in the slice given to Publish;
// every other record was acknowledged); without one the consumer
// republishes the records one by one to find them.
// producer.PermanentError has both; meaning crosses packages as methods.
func IsPermanent(err error) bool {
	var p interface{ Permanent() bool }
	if errors.As(err, &p) && p.Permanent() {
		return true
	}
	return isTooLarge(err)
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
