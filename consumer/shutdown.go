package consumer

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
)

// stopGrace is the least time Run waits for its pipeline and readers after
// telling them to stop, and so the most it may overrun ShutdownTimeout.
const stopGrace = 500 * time.Millisecond

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// groupCloser closes the ConsumerGroup at most once, in the background.
// Closing it while the generation's manager is still running is what makes
// kafka-go leave the group instead of joining a next generation, as long as
// the generation has not ended; for one that has, see refuseRejoin.
type groupCloser struct {
	once sync.Once
	cg   *kafka.ConsumerGroup
	done chan struct{} // closed when Close returned
	// stopping is closed when closing starts: a join held back then
	// (holdRejoin) is refused, and a dial after it, the leave's, is not
	// held (see waitRejoin).
	stopping chan struct{}
	// rejoinAt is when the group's next dial may go (Unix nanoseconds; see
	// holdRejoin).
	rejoinAt atomic.Int64
	// brokers is the length of the bootstrap list kafka-go dials through.
	brokers int
	// refusals is how many of the group's next dials fail (see
	// refuseRejoin).
	refusals atomic.Int32
}

// errNoRejoin is the dial error that stops kafka-go's rejoin.
var errNoRejoin = errors.New("consumer: leaving the group, not joining its next generation")

// dialer returns d for the ConsumerGroup's own connections, with the gate
// refuseRejoin closes in front of its dial (TLS and SASL still run on top,
// as kafka-go applies them to what DialFunc returns).
func (g *groupCloser) dialer(d *kafka.Dialer) *kafka.Dialer {
	gd := *d
	next := d.DialFunc
	if next == nil { // what kafka-go dials with then; DualStack is net's default now
		next = (&net.Dialer{LocalAddr: d.LocalAddr, FallbackDelay: d.FallbackDelay, KeepAlive: d.KeepAlive}).DialContext
	}
	gd.DialFunc = func(ctx context.Context, network, address string) (net.Conn, error) {
		if g.takeRefusal() {
			return nil, errNoRejoin
		}
		if err := g.waitRejoin(ctx); err != nil {
			return nil, err
		}
		return next(ctx, network, address)
	}
	return &gd
}

// takeRefusal uses up one refusal if any is left and reports whether it did.
func (g *groupCloser) takeRefusal() bool {
	for {
		n := g.refusals.Load()
		if n <= 0 {
			return false
		}
		if g.refusals.CompareAndSwap(n, n-1) {
			return true
		}
	}
}

// refuseRejoin makes the group's next attempt to reach the cluster fail.
// Once a generation has ended (a heartbeat saw a rebalance), kafka-go joins
// the next one as soon as the generation's functions return, without
// looking whether the group is being closed: only a failed connection
// stops that join, and kafka-go then leaves the group (with the member id
// it has, on fresh connections), sees the group closed and stops.
//
// A join starts by finding the coordinator through the bootstrap list, and
// kafka-go (v0.4.51, makeConnect) dials its brokers one after another
// until one answers: a single refused dial only moved the join on to the
// next broker, and with two or more brokers the stopped member joined the
// next generation and left it at once, rebalancing every member twice. So
// as many dials are refused as there are bootstrap brokers, one per
// address tried (kafka-go calls DialFunc once for each), which fails that
// round whatever its length; the leave's round after it goes through. Were
// a round ever shorter (a custom Dialer.Resolver failing an address before
// its dial), a refusal would be left for the leave's round, which then
// goes on to the brokers after it: at worst a leave that fails (the
// coordinator drops the member at the rebalance timeout), never a join.
//
// Call it before the generation's manager returns, and only for a
// generation that has ended: for a live one kafka-go's next dials are the
// leave itself.
func (g *groupCloser) refuseRejoin() {
	g.refusals.Store(int32(g.brokers))
}

// start begins closing the group; later calls do nothing.
func (g *groupCloser) start() {
	g.once.Do(func() {
		if g.stopping != nil {
			close(g.stopping)
		}
		go func() {
			_ = g.cg.Close()
			close(g.done)
		}()
	})
}

// wait starts closing if needed and reports whether Close returned by
// deadline.
func (g *groupCloser) wait(deadline time.Time) bool {
	g.start()
	return waitChan(g.done, deadline)
}

// stopClock records when Run's ctx ended: the start of the shutdown budget.
type stopClock struct{ at atomic.Int64 }

// mark records now as the stop time unless one is recorded, and returns the
// recorded time.
func (s *stopClock) mark() time.Time {
	s.at.CompareAndSwap(0, time.Now().UnixNano())
	return time.Unix(0, s.at.Load())
}

// waitChan waits until ch is closed or deadline passes; it reports whether
// ch was closed.
func waitChan(ch <-chan struct{}, deadline time.Time) bool {
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-t.C:
		return false
	}
}

// waitUntil waits for wg until deadline; it reports whether wg finished.
func waitUntil(wg *sync.WaitGroup, deadline time.Time) bool {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	return waitChan(done, deadline)
}
