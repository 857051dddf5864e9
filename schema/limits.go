package schema

// Limits bounds what DecodeEvent accepts, so one hostile or broken record
// cannot make the scorer allocate unbounded memory or queue an unbounded
// number of inference pairs. Each bound is inclusive (a value equal to the
// limit is accepted). A zero field means "use the DefaultLimits value" so a
// partially filled Limits stays safe; a negative field disables that check.
type Limits struct {
	// MaxMessageBytes bounds the raw record value, checked before parsing.
	MaxMessageBytes int
	// MaxSentences bounds the sentence count over all sections.
	MaxSentences int
	// MaxSentenceBytes bounds one sentence's UTF-8 length after decoding.
	MaxSentenceBytes int
	// MaxFieldBytes bounds each identity field (call_id, entity_id,
	// company_name, call_name, event_time, version_id) and section names.
	MaxFieldBytes int
	// MaxSections bounds the number of sections.
	MaxSections int
}

// Default limit values. They are sized from the seed corpus (at most 988
// sentences and 1785 characters per sentence) with wide headroom:
//   - 8 MiB per message (MAX_MESSAGE_BYTES), 85 times the seed's largest
//     transcript (99 KB). The result of a record can be larger than the
//     record (every sentence can match every label, see
//     producer.Config.MaxResultBytes): with three labels an 8 MiB record's
//     can take about 57 MB, which a topic holds under Kafka's default
//     socket.request.max.bytes (100 MiB); 16 MiB would need about 134 MB;
//   - 100 000 sentences is accepted (the bound is inclusive), 100 001 is not;
//   - 1 MiB per sentence: a 1 MB (10^6 byte) sentence is accepted, anything
//     over 1 MiB (1 048 576 bytes) is rejected as too_large. The tokenizer
//     truncates long premises anyway, so a longer "sentence" is almost
//     certainly a splitting bug upstream;
//   - 4 KiB per identity field, since these become Kafka keys and JDBC
//     primary-key columns;
//   - 64 sections (the seed has two).
const (
	DefaultMaxMessageBytes  = 8 << 20
	DefaultMaxSentences     = 100_000
	DefaultMaxSentenceBytes = 1 << 20
	DefaultMaxFieldBytes    = 4 << 10
	DefaultMaxSections      = 64
)

// FetchSlack is what a consumer fetches beyond MaxMessageBytes of one
// record, room for its key, headers and framing, so that an oversized
// record still arrives and reaches the DLQ path. The producer sizes dead
// letters by it: a dead letter's key and original headers can add this
// much to its value.
const FetchSlack = 64 << 10

// DefaultLimits returns the limits scorer runs with unless configured
// otherwise; see the Default* constants for the reasoning.
func DefaultLimits() Limits {
	return Limits{
		MaxMessageBytes:  DefaultMaxMessageBytes,
		MaxSentences:     DefaultMaxSentences,
		MaxSentenceBytes: DefaultMaxSentenceBytes,
		MaxFieldBytes:    DefaultMaxFieldBytes,
		MaxSections:      DefaultMaxSections,
	}
}

// Effective returns l with its zero fields filled from DefaultLimits: the
// limits DecodeEvent applies.
func (l Limits) Effective() Limits { return l.effective() }

// effective fills zero fields from DefaultLimits.
func (l Limits) effective() Limits {
	d := DefaultLimits()
	if l.MaxMessageBytes == 0 {
		l.MaxMessageBytes = d.MaxMessageBytes
	}
	if l.MaxSentences == 0 {
		l.MaxSentences = d.MaxSentences
	}
	if l.MaxSentenceBytes == 0 {
		l.MaxSentenceBytes = d.MaxSentenceBytes
	}
	if l.MaxFieldBytes == 0 {
		l.MaxFieldBytes = d.MaxFieldBytes
	}
	if l.MaxSections == 0 {
		l.MaxSections = d.MaxSections
	}
	return l
}

// exceeds reports whether n is over limit; negative limits never trip.
func exceeds(n, limit int) bool { return limit >= 0 && n > limit }
