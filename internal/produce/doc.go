// Package produce is `scorer produce`, which loads a TranscriptEvent JSONL
// file into a topic, and the demo `scorer run --demo-file` runs (load a
// sample, follow the output topic, print a summary): the development tools
// that write to Kafka as a client of the scorer would. Records go out
// unvalidated, keyed by call_id, so the scorer decides what is bad input.
package produce
