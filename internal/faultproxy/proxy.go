// Package faultproxy is a TCP proxy for fault-injection tests: it forwards
// connections from its listen address to a target and, on command, cuts
// every open connection, delays every forwarded chunk, pauses forwarding
// (connections stay open, bytes stop flowing, like a network partition) or
// refuses new connections (like a broker that is down).
//
// Kafka clients connect to the addresses the broker advertises in its
// Metadata and FindCoordinator responses, not to the bootstrap address, so a
// proxy in front of a broker only sees all the traffic when the broker
// advertises the proxy's address. For an in-process kfake cluster,
// AdvertiseAs wraps the broker's listener so that it does (pass it through
// kfake.ListenFn).
package faultproxy

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy forwards TCP connections from Addr to a target. Its methods are safe
// for concurrent use. Create it with Listen; Close stops it.
type Proxy struct {
	ln net.Listener

	mu      sync.Mutex
	target  string
	conns   map[*pair]struct{}
	delay   time.Duration
	refuse  bool
	resumed chan struct{} // non-nil while paused; closed by Resume
	closed  bool

	accepted, refused, cuts atomic.Uint64
	bytes                   atomic.Uint64
	wg                      sync.WaitGroup
}

// Stats counts what the proxy did, for test assertions and logs.
type Stats struct {
	Accepted uint64 // connections forwarded
	Refused  uint64 // connections closed at once while refusing (or failing to dial the target)
	Cut      uint64 // connections closed by Cut
	Bytes    uint64 // bytes forwarded, both directions
	Open     int    // connections open now
}

// pair is one proxied connection: the client side and the target side.
type pair struct {
	client, server net.Conn
	once           sync.Once
	done           chan struct{} // closed by close
}

func (p *pair) close() {
	p.once.Do(func() {
		close(p.done)
		_ = p.client.Close()
		_ = p.server.Close()
	})
}

// Listen starts a proxy on addr (host:port; port 0 picks a free one)
// forwarding to target. target may be empty and set later with SetTarget;
// until then connections are refused.
func Listen(addr, target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen %s: %w", addr, err)
	}
	p := &Proxy{ln: ln, target: target, conns: map[*pair]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's listen address (host:port).
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetTarget changes where new connections go; open ones are kept.
func (p *Proxy) SetTarget(target string) {
	p.mu.Lock()
	p.target = target
	p.mu.Unlock()
}

// Cut closes every open connection now, as a broker crash or a reset
// would; new connections are accepted as before. It returns how many it cut.
func (p *Proxy) Cut() int {
	p.mu.Lock()
	cut := make([]*pair, 0, len(p.conns))
	for c := range p.conns {
		cut = append(cut, c)
		delete(p.conns, c)
	}
	p.mu.Unlock()
	for _, c := range cut {
		c.close()
	}
	p.cuts.Add(uint64(len(cut)))
	return len(cut)
}

// SetDelay delays every forwarded chunk, in both directions, by d (0 = none).
func (p *Proxy) SetDelay(d time.Duration) {
	p.mu.Lock()
	p.delay = d
	p.mu.Unlock()
}

// Pause stops forwarding: open connections stay open but no byte moves in
// either direction until Resume, and new connections are accepted but not
// served. Clients see requests that never get an answer.
func (p *Proxy) Pause() {
	p.mu.Lock()
	if p.resumed == nil {
		p.resumed = make(chan struct{})
	}
	p.mu.Unlock()
}

// Resume undoes Pause.
func (p *Proxy) Resume() {
	p.mu.Lock()
	if p.resumed != nil {
		close(p.resumed)
		p.resumed = nil
	}
	p.mu.Unlock()
}

// Refuse makes the proxy close new connections at once (on) or forward them
// again (off). Open connections are not touched; combine with Cut for a
// broker that goes down.
func (p *Proxy) Refuse(on bool) {
	p.mu.Lock()
	p.refuse = on
	p.mu.Unlock()
}

// Stats returns the counters.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	open := len(p.conns)
	p.mu.Unlock()
	return Stats{Accepted: p.accepted.Load(), Refused: p.refused.Load(), Cut: p.cuts.Load(), Bytes: p.bytes.Load(), Open: open}
}

// Close stops listening, closes every connection and waits for the
// proxy's goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	if p.resumed != nil {
		close(p.resumed)
		p.resumed = nil
	}
	p.mu.Unlock()
	err := p.ln.Close()
	p.Cut()
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		refuse, target, closed := p.refuse || p.target == "", p.target, p.closed
		p.mu.Unlock()
		if refuse || closed {
			p.refused.Add(1)
			_ = c.Close()
			continue
		}
		p.wg.Add(1)
		go p.serve(c, target)
	}
}

func (p *Proxy) serve(client net.Conn, target string) {
	defer p.wg.Done()
	server, err := net.DialTimeout("tcp", target, 5*time.Second)
	if err != nil {
		p.refused.Add(1)
		_ = client.Close()
		return
	}
	c := &pair{client: client, server: server, done: make(chan struct{})}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		c.close()
		return
	}
	p.conns[c] = struct{}{}
	p.mu.Unlock()
	p.accepted.Add(1)
	var both sync.WaitGroup
	both.Add(2)
	go func() { defer both.Done(); p.pipe(server, client, c) }()
	go func() { defer both.Done(); p.pipe(client, server, c) }()
	both.Wait()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// pipe copies src to dst chunk by chunk, honouring pause and delay; when
// either side ends it closes both.
func (p *Proxy) pipe(dst, src net.Conn, c *pair) {
	defer c.close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !p.wait(c.done) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
			p.bytes.Add(uint64(n))
		}
		if err != nil {
			return // EOF or a closed side: either way this pair is over
		}
	}
}

// wait blocks while paused and sleeps the configured delay; it reports
// false once the proxy or this connection (done) is closed.
func (p *Proxy) wait(done <-chan struct{}) bool {
	for {
		p.mu.Lock()
		resumed, delay, closed := p.resumed, p.delay, p.closed
		p.mu.Unlock()
		if closed {
			return false
		}
		if resumed != nil {
			select {
			case <-resumed:
			case <-done:
				return false
			}
			continue
		}
		if delay > 0 {
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-done:
				t.Stop()
				return false
			}
		}
		return true
	}
}

// AdvertiseAs wraps a listener so that Addr reports addr instead of the
// listener's own address. A kfake broker advertises its listener's Addr in
// Metadata and FindCoordinator, so listening through
//
//	kfake.ListenFn(func(network, a string) (net.Listener, error) {
//		ln, err := net.Listen(network, a)
//		if err != nil { return nil, err }
//		return faultproxy.AdvertiseAs(ln, proxy.Addr()), nil
//	})
//
// makes every client connection go through the proxy, after bootstrap too.
func AdvertiseAs(ln net.Listener, addr string) net.Listener {
	return advertised{Listener: ln, addr: tcpAddr(addr)}
}

type advertised struct {
	net.Listener
	addr net.Addr
}

func (a advertised) Addr() net.Addr { return a.addr }

// tcpAddr is a net.Addr for a host:port string.
type tcpAddr string

func (a tcpAddr) Network() string { return "tcp" }
func (a tcpAddr) String() string  { return string(a) }
