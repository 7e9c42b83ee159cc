package integration_test

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// netProxy is a TCP proxy on loopback between workers and PostgreSQL that can delay the
// traffic, throttle it or cut the link, and follows the server when it moves to another
// port (a restarted container).
type netProxy struct {
	ln      net.Listener
	target  atomic.Pointer[string]
	latency atomic.Int64 // added to every chunk forwarded, in nanoseconds
	rate    atomic.Int64 // bytes per second each way on each connection; 0: unlimited
	down    atomic.Bool  // refusing connections

	mu    sync.Mutex
	conns map[net.Conn]bool
}

// newNetProxy starts a proxy to target ("host:port"), closed when t ends.
func newNetProxy(t testing.TB, target string) *netProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &netProxy{ln: ln, conns: map[net.Conn]bool{}}
	p.target.Store(&target)
	go p.serve()
	t.Cleanup(func() {
		_ = ln.Close()
		p.cutAll()
	})
	return p
}

// Addr is the proxy's address, to connect to instead of the server's.
func (p *netProxy) Addr() string { return p.ln.Addr().String() }

// SetTarget makes new connections go to target.
func (p *netProxy) SetTarget(target string) { p.target.Store(&target) }

// SetLatency delays every chunk of traffic, both ways, by d (0: none).
func (p *netProxy) SetLatency(d time.Duration) { p.latency.Store(int64(d)) }

// SetRate throttles every connection to bytesPerSecond each way (0: unlimited).
func (p *netProxy) SetRate(bytesPerSecond int64) { p.rate.Store(bytesPerSecond) }

// Cut closes every connection through the proxy and refuses new ones for d: a network
// partition, as the client sees it.
func (p *netProxy) Cut(d time.Duration) {
	p.down.Store(true)
	p.cutAll()
	time.AfterFunc(d, func() { p.down.Store(false) })
}

func (p *netProxy) cutAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.Close()
	}
}

func (p *netProxy) track(c net.Conn, on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if on {
		p.conns[c] = true
	} else {
		delete(p.conns, c)
	}
}

func (p *netProxy) serve() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.down.Load() {
			_ = client.Close()
			continue
		}
		go p.forward(client)
	}
}

func (p *netProxy) forward(client net.Conn) {
	server, err := net.DialTimeout("tcp", *p.target.Load(), 5*time.Second)
	if err != nil {
		_ = client.Close()
		return
	}
	p.track(client, true)
	p.track(server, true)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				d := time.Duration(p.latency.Load())
				if r := p.rate.Load(); r > 0 {
					d += time.Duration(int64(n) * int64(time.Second) / r)
				}
				if d > 0 {
					time.Sleep(d)
				}
				if _, werr := dst.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil { // EOF or a closed connection: end both directions
				break
			}
		}
		_ = dst.Close()
		_ = src.Close()
		done <- struct{}{}
	}
	go pipe(server, client)
	go pipe(client, server)
	<-done
	<-done
	p.track(client, false)
	p.track(server, false)
}
