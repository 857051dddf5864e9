package consumer

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/rs/zerolog"
	"github.com/segmentio/kafka-go"

	"github.com/scorer/scorer/schema"
)

// processorFor builds a processor over sc and sk, without a broker, and
// records what it settles.
func processorFor(t *testing.T, sc Scorer, sk Sink) (*processor, *[]string) {
	t.Helper()
	m, err := newMetrics(nil, func() float64 { return 0 })
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Brokers: []string{"x:9092"}, RetryBackoff: 1, RetryBackoffMax: 1}.WithDefaults()
	var settled []string
	pr := &processor{cfg: cfg, scorer: sc, sink: sk, log: zerolog.Nop(), m: m, settle: func(r *record, ack bool) {
		if ack {
			settled = append(settled, string(r.msg.Key))
		}
	}}
	return pr, &settled
}

// TestProcessorBatch: the processor on its own, with a fake scorer and sink:
// a batch holding an event, an undecodable record, a tombstone and an event
// the scorer rejects as invalid comes out as one result, one tombstone and
// two dead letters, in input order, each record acknowledged once its
// output was.
func TestProcessorBatch(t *testing.T) {
	t.Parallel()
	sc := &fakeScorer{hook: func(_ context.Context, evs []schema.TranscriptEvent) error {
		for _, e := range evs {
			if e.CallID == "invalid" {
				return &permanentSinkError{Err: errors.New("invalid input")}
			}
		}
		return nil
	}}
	sk := &fakeSink{}
	pr, settled := processorFor(t, sc, sk)
	g := &genState{id: 7}
	g.ctx, g.cancel = context.WithCancel(t.Context())
	defer g.cancel()
	ps := newPartState(0, -1)
	var recs []*record
	for i, m := range []kafka.Message{
		eventMsg(0, "good"),
		{Key: []byte("bad"), Value: []byte(`{bad`)},
		{Key: []byte("gone")},
		eventMsg(0, "invalid"),
	} {
		m.Offset = int64(i)
		recs = append(recs, &record{msg: m, gen: g, ps: ps, done: func() {}})
	}
	out := pr.prepare(recs)
	pr.acknowledge(out.of(&turn{g: g, ps: ps, recs: recs}))

	if got, want := sk.Writes(), []string{"result:good", "delete:gone"}; !slices.Equal(got, want) {
		t.Errorf("writes %v, want %v", got, want)
	}
	reasons := map[string]string{}
	for _, d := range sk.Dead() {
		reasons[string(d.Key)] = d.Reason
	}
	if len(reasons) != 2 || reasons["bad"] != "malformed_json" || reasons["invalid"] != ReasonScoreFailed {
		t.Errorf("dead letters %v, want bad: malformed_json and invalid: %s", reasons, ReasonScoreFailed)
	}
	slices.Sort(*settled)
	if want := []string{"bad", "gone", "good", "invalid"}; !slices.Equal(*settled, want) {
		t.Errorf("acknowledged %v, want %v", *settled, want)
	}
	if res := sk.Published(); len(res) != 1 || res[0].Source == nil || res[0].Source.Generation != 7 || res[0].Source.Offset != 0 {
		t.Errorf("published %+v, want good with its source", res)
	}
}

// TestProcessorRevokedWritesNothing: a batch of a generation revoked while
// it was scored is neither published nor dead-lettered, and nothing of it
// is acknowledged: the partition's next owner handles it.
func TestProcessorRevokedWritesNothing(t *testing.T) {
	t.Parallel()
	sk := &fakeSink{}
	pr, settled := processorFor(t, &fakeScorer{}, sk)
	g := &genState{id: 1}
	g.ctx, g.cancel = context.WithCancel(t.Context())
	ps := newPartState(0, -1)
	recs := []*record{
		{msg: eventMsg(0, "a"), gen: g, ps: ps, done: func() {}},
		{msg: kafka.Message{Key: []byte("bad"), Value: []byte(`{bad`)}, gen: g, ps: ps, done: func() {}},
	}
	out := pr.prepare(recs)
	g.revoke()
	pr.acknowledge(out.of(&turn{g: g, ps: ps, recs: recs}))
	if len(sk.Writes()) != 0 || len(sk.Dead()) != 0 || len(*settled) != 0 {
		t.Errorf("revoked generation wrote %v, dead-lettered %d, acknowledged %v", sk.Writes(), len(sk.Dead()), *settled)
	}
}
