package main

import (
	"errors"
	"math"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"time"
)

// A link is one directed network path of the cluster — a service to one
// NATS node, a service to one Postgres host, a NATS node to a peer's route
// port, a standby to its primary — carried by a TCP proxy in the harness:
// the source is given the link's address instead of the target's. The
// harness cuts it, slows it or makes it lose packets, and the two
// processes at its ends see what they would see of a real network:
//
//   - cut, nothing moves either way and nothing is refused: bytes already
//     sent wait (the sender's buffers fill, as with unacknowledged
//     segments), a new connection is taken but answers nothing, and a
//     closed end is not told to the other side until the link heals. No
//     RST, no FIN: silence, as a partition looks to TCP. What waited is
//     delivered when the link heals, as retransmission would.
//   - delayed, every chunk is delivered its delay after it was read, in
//     order, each way.
//   - lossy, a chunk of n bytes is held back by a retransmission timeout
//     with the probability that one of its segments is lost, and behind it
//     everything that follows (TCP's head-of-line blocking): the stream a
//     process reads from a lossy link, which is all a process can see of
//     packet loss.
//
// A process killed at one end closes its sockets; the proxy passes the
// close on (unless cut), as the kernel would.
type link struct {
	name   string // "classifier-us-1>nats-us-2"
	from   string // the source's name
	to     string // the target's name
	target string // host:port the link carries to

	ln  net.Listener
	rng *rand.Rand

	mu     sync.Mutex
	st     linkState
	open   chan struct{} // closed while the link is not cut
	conns  map[net.Conn]struct{}
	closed bool
}

// linkState is what a fault does to a link.
type linkState struct {
	Cut   bool
	Delay time.Duration // each way
	Loss  float64       // probability a segment is lost
}

const segment = 1448 // payload bytes of one TCP segment on a 1500-byte path

// linkHost is the loopback address the links listen on: apart from
// 127.0.0.1, where the processes take the ports they were given, so a
// link never takes one of theirs.
const linkHost = "127.0.0.2"

func newLink(name, from, to, target string, seed uint64) (*link, error) {
	ln, err := net.Listen("tcp", linkHost+":0")
	if err != nil {
		return nil, err
	}
	open := make(chan struct{})
	close(open)
	l := &link{name: name, from: from, to: to, target: target, ln: ln, open: open,
		rng: rand.New(rand.NewPCG(seed, 0x6c696e6b)), conns: map[net.Conn]struct{}{}}
	go l.accept()
	return l, nil
}

// addr is where the source connects to reach the target.
func (l *link) addr() string { return l.ln.Addr().String() }

// set changes what the link does; cutting it holds every byte in flight.
func (l *link) set(st linkState) {
	l.mu.Lock()
	defer l.mu.Unlock()
	was := l.st.Cut
	l.st = st
	switch {
	case st.Cut && !was:
		l.open = make(chan struct{})
	case !st.Cut && was:
		close(l.open)
	}
}

func (l *link) state() (linkState, chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.st, l.open
}

// close stops the link and every connection it carries.
func (l *link) close() {
	l.mu.Lock()
	l.closed = true
	conns := l.conns
	l.conns = map[net.Conn]struct{}{}
	if l.st.Cut {
		l.st.Cut = false
		close(l.open)
	}
	l.mu.Unlock()
	_ = l.ln.Close()
	for c := range conns {
		_ = c.Close()
	}
}

func (l *link) track(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false
	}
	l.conns[c] = struct{}{}
	return true
}

func (l *link) untrack(c net.Conn) {
	l.mu.Lock()
	delete(l.conns, c)
	l.mu.Unlock()
}

func (l *link) accept() {
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return
		}
		go l.serve(c)
	}
}

// serve carries one connection: it reaches the target only once the link
// is not cut (a connection opened across a partition gets its handshake
// when the partition heals, if the source still waits), and a target that
// refuses is passed on as a close.
func (l *link) serve(c net.Conn) {
	if !l.track(c) {
		_ = c.Close()
		return
	}
	defer l.untrack(c)
	defer c.Close()
	l.waitOpen()
	t, err := net.DialTimeout("tcp", l.target, 5*time.Second)
	if err != nil {
		return
	}
	if !l.track(t) {
		_ = t.Close()
		return
	}
	defer l.untrack(t)
	defer t.Close()
	done := make(chan struct{}, 2)
	go func() { l.pipe(c, t); done <- struct{}{} }()
	go func() { l.pipe(t, c); done <- struct{}{} }()
	<-done
}

func (l *link) waitOpen() {
	for {
		st, open := l.state()
		if !st.Cut {
			return
		}
		<-open
	}
}

type chunk struct {
	b  []byte
	at time.Time
}

// pipe copies src to dst through the link: a reader stamps each chunk, a
// writer delivers it when the link lets it. When src ends, what was read
// is still delivered, then both ends are closed.
func (l *link) pipe(src, dst net.Conn) {
	ch := make(chan chunk, 16)
	go func() {
		defer close(ch)
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				ch <- chunk{b: append([]byte(nil), buf[:n]...), at: time.Now()}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range ch {
		l.waitOpen()
		st, _ := l.state()
		due := c.at.Add(st.Delay)
		if st.Loss > 0 {
			// Every segment of the chunk is sent until it arrives; the
			// chunk waits for the unluckiest, one retransmission timeout
			// (doubling) per round it needed beyond the first.
			segs := math.Ceil(float64(len(c.b)) / segment)
			rto := 200*time.Millisecond + 2*st.Delay
			for r := 1.0; !l.chance(math.Pow(1-math.Pow(st.Loss, r), segs)); r++ {
				if now := time.Now(); due.Before(now) {
					due = now
				}
				due = due.Add(rto)
				rto = min(2*rto, 10*time.Second)
			}
		}
		if d := time.Until(due); d > 0 {
			time.Sleep(d)
		}
		l.waitOpen()
		if _, err := dst.Write(c.b); err != nil {
			break
		}
	}
	// The end's close crosses the link like its bytes: not while it is
	// cut. Then what the reader still sends is drained and both ends
	// close, which stops the other pipe's reader too.
	l.waitOpen()
	go func() {
		for range ch {
		}
	}()
	_ = src.Close()
	_ = dst.Close()
}

func (l *link) chance(p float64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.rng.Float64() < p
}

// links are every link of a run, by name.
type links struct {
	mu   sync.Mutex
	all  map[string]*link
	seed uint64
}

func newLinks(seed int64) *links { return &links{all: map[string]*link{}, seed: uint64(seed)} }

// add makes the link from → to carrying to target and returns its address.
func (ls *links) add(from, to, target string) (string, error) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	name := from + ">" + to
	if l, ok := ls.all[name]; ok {
		if l.target != target {
			return "", errors.New("link " + name + " exists to another target")
		}
		return l.addr(), nil
	}
	l, err := newLink(name, from, to, target, ls.seed+uint64(len(ls.all)))
	if err != nil {
		return "", err
	}
	ls.all[name] = l
	return l.addr(), nil
}

// between are the links in either direction between any of a and any of b.
func (ls *links) between(a, b []string) []*link {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	var out []*link
	for _, l := range ls.all {
		if slices.Contains(a, l.from) && slices.Contains(b, l.to) || slices.Contains(b, l.from) && slices.Contains(a, l.to) {
			out = append(out, l)
		}
	}
	return out
}

// set applies st to every link in ls.
func setLinks(ls []*link, st linkState) {
	for _, l := range ls {
		l.set(st)
	}
}

func (ls *links) closeAll() {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	for _, l := range ls.all {
		l.close()
	}
}
