package redislock

import (
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// faultProxy forwards loopback TCP connections to a server, and can delay
// every chunk of data in both directions, drop a connection at random, or
// cut all of them. Data is never reordered within a connection.
type faultProxy struct {
	ln       net.Listener
	target   string
	delay    atomic.Int64 // ns added before forwarding each chunk
	delayUp  atomic.Int64 // ns added before forwarding each chunk a client sends
	dropPerK atomic.Int64 // chance per 1000 chunks of closing the connection
	// dropReplies is how many of the server's next replies to swallow, each
	// by closing its connection instead of forwarding it: the server ran
	// the command, the client never hears of it.
	dropReplies atomic.Int64
	replyDrops  atomic.Int64 // replies dropped so
	// stallNext, when set, holds the next chunk a client sends for that
	// long (ns) before the server gets it; stalled counts those delivered.
	stallNext atomic.Int64
	stalled   atomic.Int64
	faults    atomic.Int64 // chunks delayed, connections dropped or cut
	// held, while not nil, holds every chunk in both directions until it
	// is closed: a link that stalls, then heals (hold, release).
	held atomic.Pointer[chan struct{}]

	mu      sync.Mutex
	conns   map[net.Conn]struct{}
	wg      sync.WaitGroup
	closing chan struct{} // ends every delay
}

func startProxy(t *testing.T, target string) *faultProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &faultProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}, closing: make(chan struct{})}
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(p.close)
	return p
}

func (p *faultProxy) Addr() string { return p.ln.Addr().String() }

func (p *faultProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns[c], p.conns[s] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(s, c, false)
		go p.pipe(c, s, true)
	}
}

// pipe copies src to dst until either fails, then closes both. toClient
// is the direction of the server's replies.
func (p *faultProxy) pipe(dst, src net.Conn, toClient bool) {
	defer p.wg.Done()
	defer p.forget(dst, src)
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if held := p.held.Load(); held != nil {
				select {
				case <-*held:
				case <-p.closing:
					return
				}
			}
			if d := p.takeStall(toClient); d > 0 {
				p.faults.Add(1)
				select {
				case <-time.After(d):
				case <-p.closing:
					return
				}
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
				p.stalled.Add(1)
				continue
			}
			d := time.Duration(p.delay.Load())
			if !toClient {
				d += time.Duration(p.delayUp.Load())
			}
			if d > 0 {
				p.faults.Add(1)
				select {
				case <-time.After(d):
				case <-p.closing:
					return
				}
			}
			if toClient && p.dropReplies.Load() > 0 && p.dropReplies.Add(-1) >= 0 {
				p.faults.Add(1)
				p.replyDrops.Add(1)
				return
			}
			if k := p.dropPerK.Load(); k > 0 && rand.Int64N(1000) < k {
				p.faults.Add(1)
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil { // io.EOF or a closed connection alike
			return
		}
	}
}

func (p *faultProxy) forget(conns ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range conns {
		c.Close()
		delete(p.conns, c)
	}
}

// cutAll closes every connection, as a network partition that heals at once.
func (p *faultProxy) cutAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
		delete(p.conns, c)
		p.faults.Add(1)
	}
}

func (p *faultProxy) close() {
	close(p.closing)
	p.ln.Close()
	p.cutAll()
	p.wg.Wait()
}

// hold stalls the link: no chunk goes through until release.
func (p *faultProxy) hold() {
	ch := make(chan struct{})
	if p.held.CompareAndSwap(nil, &ch) {
		p.faults.Add(1)
	}
}

// release lets the chunks held since hold through, in order.
func (p *faultProxy) release() {
	if ch := p.held.Swap(nil); ch != nil {
		close(*ch)
	}
}

// takeStall returns the stall armed for the next chunk a client sends, once.
func (p *faultProxy) takeStall(toClient bool) time.Duration {
	if toClient || p.stallNext.Load() == 0 {
		return 0
	}
	return time.Duration(p.stallNext.Swap(0))
}
