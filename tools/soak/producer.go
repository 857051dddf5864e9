package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/scorer/scorer/schema"
)

// call is a transcript being revised: each new version is sent only after
// the broker acknowledged the previous one, so a call's versions are in
// version order on its partition (the input is keyed by call_id).
type call struct {
	id       string
	version  int // the last version acknowledged
	last     int // the version after which the call is left alone
	sentence []string
}

// producer writes small real transcripts (1–3 corpus sentences, one
// section) at a steady rate, several versions per call_id, and keeps the
// ledger of what the broker acknowledged and where.
type producer struct {
	addr  string
	cl    *kgo.Client
	rng   *rand.Rand
	sents []string
	seed  uint64

	mu         sync.Mutex // held across a produce, and by a topic's delete and re-create
	epoch      int
	ledger     []sent
	active     []*call
	next       int // calls started
	poisons    int
	lastPoison string
	errors     int
	lastErr    error
}

func newProducer(addr string, seed uint64, sents []string) (*producer, error) {
	p := &producer{addr: addr, rng: rand.New(rand.NewPCG(seed, 0x50a4)), sents: sents, seed: seed}
	var err error
	p.cl, err = p.client()
	return p, err
}

func (p *producer) client() (*kgo.Client, error) {
	return kgo.NewClient(kgo.SeedBrokers(p.addr), kgo.DefaultProduceTopic(inputTopic),
		kgo.ProducerLinger(0), kgo.RecordDeliveryTimeout(time.Minute))
}

// reconnect replaces the client; the caller holds p.mu.
func (p *producer) reconnect() error {
	cl, err := p.client()
	if err != nil {
		return err
	}
	p.cl.Close()
	p.cl = cl
	return nil
}

func (p *producer) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cl.Close()
}

// run sends about rate transcripts a second until ctx ends.
func (p *producer) run(ctx context.Context, rate float64) {
	const tick = 500 * time.Millisecond
	t := time.NewTicker(tick)
	defer t.Stop()
	owed := 0.0
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		owed += rate * tick.Seconds()
		n := int(owed)
		owed -= float64(n)
		p.send(ctx, n)
	}
}

// send writes n transcripts: new calls and next versions of open ones,
// never two versions of one call in one request.
func (p *producer) send(ctx context.Context, n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	used := map[*call]bool{}
	var recs []*kgo.Record
	var calls []*call
	for range n {
		var c *call
		if len(p.active) < 8 || p.rng.Float64() < 0.4 {
			p.next++
			c = &call{id: fmt.Sprintf("SOAK-%d-%06d", p.seed%100000, p.next), last: 2 + p.rng.IntN(4)}
			c.sentence = p.pick(1 + p.rng.IntN(3))
			p.active = append(p.active, c)
		} else {
			c = p.active[p.rng.IntN(len(p.active))]
			if used[c] {
				continue
			}
			p.revise(c)
		}
		used[c] = true
		v := c.version + 1
		ev := schema.TranscriptEvent{CallID: c.id, EntityID: "SOAK", CompanyName: "Soak Test Inc.",
			EventTime: "2026-11-29T04:00:00Z", VersionID: strconv.Itoa(v), Sections: map[string][]string{"FILT_MD": c.sentence}}
		b, err := json.Marshal(ev)
		if err != nil {
			panic(err) // a struct of strings always marshals
		}
		recs = append(recs, &kgo.Record{Key: []byte(c.id), Value: b})
		calls = append(calls, c)
	}
	if len(recs) == 0 {
		return
	}
	byRec := make(map[*kgo.Record]*call, len(recs))
	for i, r := range recs {
		byRec[r] = calls[i]
	}
	// ProduceSync lists results as the broker answered, not in the order
	// given: each result names its record.
	for _, r := range p.cl.ProduceSync(ctx, recs...) {
		c := byRec[r.Record]
		if r.Err != nil {
			// Not known to be written: sent again as the same version at the
			// next tick (if it had landed, its output counts as a duplicate).
			p.errors++
			p.lastErr = r.Err
			continue
		}
		c.version++
		p.ledger = append(p.ledger, sent{call: c.id, version: c.version, epoch: p.epoch, partition: r.Record.Partition, offset: r.Record.Offset, at: time.Now()})
		if c.version >= c.last {
			for j, a := range p.active {
				if a == c {
					p.active = append(p.active[:j], p.active[j+1:]...)
					break
				}
			}
		}
	}
}

// revise changes a call for its next version: one sentence replaced, one
// added, or one dropped, as a corrected transcript would.
func (p *producer) revise(c *call) {
	s := append([]string(nil), c.sentence...)
	switch k := p.rng.IntN(3); {
	case k == 0 || len(s) == 3:
		s[p.rng.IntN(len(s))] = p.pick(1)[0]
	case k == 1 || len(s) == 1:
		s = append(s, p.pick(1)[0])
	default:
		s = s[:len(s)-1]
	}
	c.sentence = s
}

func (p *producer) pick(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = p.sents[p.rng.IntN(len(p.sents))]
	}
	return out
}

// poison writes one record that is not JSON; the scorer must dead-letter it
// with reason malformed_json.
func (p *producer) poison(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.poisons++
	id := fmt.Sprintf("POISON-%d-%04d", p.seed%100000, p.poisons)
	value := []byte(`{"call_id": "` + id + `", "version_id": "1", "sections": {"FILT_MD": ["an unterminated sentence`)
	r, err := p.cl.ProduceSync(ctx, &kgo.Record{Key: []byte(id), Value: value}).First()
	if err != nil {
		return err
	}
	p.ledger = append(p.ledger, sent{call: id, version: 1, epoch: p.epoch, partition: r.Partition, offset: r.Offset, poison: true, at: time.Now()})
	p.lastPoison = fmt.Sprintf("%s at %d/%d epoch %d", id, r.Partition, r.Offset, p.epoch)
	return nil
}

func (p *producer) snapshot() (ledger []sent, errors int, lastErr error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]sent(nil), p.ledger...), p.errors, p.lastErr
}

// corpusSentences is up to n distinct sentences of 40–160 bytes from the
// transcript corpus, in corpus order: real text, short enough that two
// cores score a few hundred pairs a second.
func corpusSentences(path string, n int) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	seen := map[string]bool{}
	var out []string
	for sc.Scan() && len(out) < n {
		ev, err := schema.DecodeEvent(sc.Bytes(), schema.DefaultLimits())
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		for _, name := range ev.SectionNames() {
			for _, s := range ev.Sections[name] {
				if len(s) >= 40 && len(s) <= 160 && !seen[s] {
					seen[s] = true
					out = append(out, s)
				}
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) < 100 {
		return nil, fmt.Errorf("%s: only %d short sentences", path, len(out))
	}
	return out, nil
}
