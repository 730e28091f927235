package dataconn

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// Key names the strand and connection a data connection is for.
type Key struct{ Strand, Conn uint32 }

// Acceptor owns a TCP listener and hands each incoming data connection to
// the strand that waits for it (strands find their connection by the
// header the connecting side sends).
type Acceptor struct {
	ln    net.Listener
	runID uint32
	fatal func(error)

	mu      sync.Mutex
	mailbox map[Key]chan net.Conn
	closed  bool
	wg      sync.WaitGroup
}

// Listen opens a TCP listener on host:port (port 0 = any) with the given
// window size applied before listen, and starts routing connections.
// fatal is called once if accepting fails for good (for example when the
// process runs out of file descriptors).
func Listen(host string, port, wndsz int, runID uint32, fatal func(error)) (*Acceptor, error) {
	lc := net.ListenConfig{Control: sockopts(wndsz)}
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	ln, err := lc.Listen(context.Background(), "tcp", addr)
	// A fixed port may still be held by the previous run's listener, which the
	// server closes while the controller already starts the next run: wait a
	// bounded time for it instead of failing the test.
	for deadline := time.Now().Add(fixedPortWait); err != nil && port != 0 &&
		errors.Is(err, syscall.EADDRINUSE) && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		ln, err = lc.Listen(context.Background(), "tcp", addr)
	}
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, Explain(err))
	}
	return newAcceptor(ln, runID, fatal), nil
}

// fixedPortWait bounds how long Listen waits for a fixed port to be released.
const fixedPortWait = 3 * time.Second

// mailboxDepth is how many connections may wait for one strand's accept. A
// strand that connects and disconnects in a loop (uperf's connect.xml,
// disconnect_iter.xml) can be several connections ahead of the accepting
// strand; the bound keeps a hostile peer from queueing without limit.
const mailboxDepth = 64

func newAcceptor(ln net.Listener, runID uint32, fatal func(error)) *Acceptor {
	a := &Acceptor{ln: ln, runID: runID, fatal: fatal, mailbox: map[Key]chan net.Conn{}}
	a.wg.Add(1)
	go a.loop()
	return a
}

// Port is the listening port.
func (a *Acceptor) Port() int { return a.ln.Addr().(*net.TCPAddr).Port }

func (a *Acceptor) box(k Key) chan net.Conn {
	a.mu.Lock()
	defer a.mu.Unlock()
	ch := a.mailbox[k]
	if ch == nil {
		ch = make(chan net.Conn, mailboxDepth)
		a.mailbox[k] = ch
	}
	return ch
}

func (a *Acceptor) loop() {
	defer a.wg.Done()
	var failures int
	for {
		nc, err := a.ln.Accept()
		if err != nil {
			a.mu.Lock()
			closed := a.closed
			a.mu.Unlock()
			if closed || errors.Is(err, net.ErrClosed) {
				return
			}
			if errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
				a.fatal(fmt.Errorf("accept: %w", Explain(err)))
				return
			}
			failures++
			if failures > 100 {
				a.fatal(fmt.Errorf("accept: %w", err))
				return
			}
			time.Sleep(5 * time.Millisecond)
			continue
		}
		failures = 0
		a.wg.Add(1)
		go a.route(nc)
	}
}

func (a *Acceptor) route(nc net.Conn) {
	defer a.wg.Done()
	_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, HeaderSize)
	if _, err := io.ReadFull(nc, buf); err != nil {
		nc.Close()
		return
	}
	_ = nc.SetReadDeadline(time.Time{})
	h, err := DecodeHeader(buf)
	if err != nil || h.RunID != a.runID {
		nc.Close()
		return
	}
	ch := a.box(Key{h.Strand, h.Conn})
	select {
	case ch <- nc:
	default:
		nc.Close() // more than mailboxDepth waiting for one strand: not a profile's doing
	}
}

// Accept waits for the data connection of strand/conn. It gives up when
// cancel is closed or after timeout (0 = no timeout).
func (a *Acceptor) Accept(k Key, o Options, cancel <-chan struct{}, timeout time.Duration) (*Conn, error) {
	ch := a.box(k)
	var tc <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		tc = t.C
	}
	select {
	case nc := <-ch:
		if err := applyTCP(nc, o); err != nil {
			nc.Close()
			return nil, err
		}
		return NewConn(nc, o), nil
	case <-cancel:
		return nil, ErrInterrupted
	case <-tc:
		return nil, fmt.Errorf("accept: no connection within %v", timeout)
	}
}

// Close stops accepting and closes connections nobody has taken.
func (a *Acceptor) Close() {
	a.mu.Lock()
	a.closed = true
	a.mu.Unlock()
	a.ln.Close()
	a.wg.Wait()
	a.mu.Lock()
	defer a.mu.Unlock()
	for k, ch := range a.mailbox {
	drain:
		for {
			select {
			case nc := <-ch:
				nc.Close()
			default:
				break drain
			}
		}
		delete(a.mailbox, k)
	}
}

// UDPEndpoint is the accepting end of one UDP "connection": a socket bound
// before the run whose port the peer learns through the control channel.
type UDPEndpoint struct {
	pc   *net.UDPConn
	mu   sync.Mutex
	used bool // an accepted connection is open on it
}

// ListenUDP binds a UDP socket on host (any port).
func ListenUDP(host string, wndsz int) (*UDPEndpoint, error) {
	lc := net.ListenConfig{Control: sockopts(wndsz)}
	pc, err := lc.ListenPacket(context.Background(), "udp", net.JoinHostPort(host, "0"))
	if err != nil {
		return nil, fmt.Errorf("udp listen on %s: %w", host, Explain(err))
	}
	return &UDPEndpoint{pc: pc.(*net.UDPConn)}, nil
}

// Port is the bound port.
func (u *UDPEndpoint) Port() int { return u.pc.LocalAddr().(*net.UDPAddr).Port }

// Close closes the socket if no Accept took it.
func (u *UDPEndpoint) Close() { u.pc.Close() }

// Accept waits for the peer's hello datagram, connects the socket to the
// sender, acknowledges, and returns the connection.
func (u *UDPEndpoint) Accept(h Header, o Options, cancel <-chan struct{}, timeout time.Duration) (*Conn, error) {
	u.mu.Lock()
	used := u.used
	u.mu.Unlock()
	if used {
		return nil, errors.New("accept: this UDP connection is still open (disconnect it first)")
	}
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-cancel:
			_ = u.pc.SetReadDeadline(time.Unix(1, 0))
		case <-done:
		}
	}()
	if timeout > 0 {
		_ = u.pc.SetReadDeadline(time.Now().Add(timeout))
	}
	buf := make([]byte, 64)
	for {
		n, from, err := u.pc.ReadFromUDP(buf)
		if err != nil {
			select {
			case <-cancel:
				return nil, ErrInterrupted
			default:
			}
			return nil, fmt.Errorf("accept (udp): %w", err)
		}
		got, err := DecodeHeader(buf[:n])
		if err != nil || got != h {
			continue
		}
		_ = u.pc.SetReadDeadline(time.Time{})
		// the socket stays unconnected (a disconnect(2) of a socket bound to
		// an ephemeral port would unbind it, and the strand may reopen the
		// connection): writes name the peer, reads skip other senders
		cc := &connectedUDP{UDPConn: u.pc, peer: from, ep: u}
		if _, err := cc.Write(h.Encode()); err != nil {
			return nil, fmt.Errorf("accept (udp): ack: %w", err)
		}
		u.mu.Lock()
		u.used = true
		u.mu.Unlock()
		return NewConn(cc, o), nil
	}
}

// connectedUDP is a UDPConn connected with connect(2) after binding; the
// net package does not know it is connected, so writes name the peer.
type connectedUDP struct {
	*net.UDPConn
	peer *net.UDPAddr
	ep   *UDPEndpoint
	once sync.Once
}

// Close ends the association but keeps the bound socket, so that the
// strand can accept the same connection again (uperf profiles reopen a UDP
// connection after a disconnect). The endpoint closes the socket at the end
// of the run.
func (c *connectedUDP) Close() error {
	c.once.Do(func() {
		_ = c.UDPConn.SetDeadline(time.Time{})
		c.ep.mu.Lock()
		c.ep.used = false
		c.ep.mu.Unlock()
	})
	return nil
}

// Read returns the next datagram from the peer; strays (a previous peer's
// late datagrams, anyone else) are dropped.
func (c *connectedUDP) Read(b []byte) (int, error) {
	for {
		n, from, err := c.UDPConn.ReadFromUDP(b)
		if err != nil || (from.Port == c.peer.Port && from.IP.Equal(c.peer.IP)) {
			return n, err
		}
	}
}

func (c *connectedUDP) Write(b []byte) (int, error) { return c.UDPConn.WriteToUDP(b, c.peer) }
func (c *connectedUDP) RemoteAddr() net.Addr        { return c.peer }

func dialUDP(ctx context.Context, d net.Dialer, addr string, h Header, o Options) (*Conn, error) {
	nc, err := d.DialContext(ctx, "udp", addr)
	if err != nil {
		return nil, fmt.Errorf("connect (udp) %s: %w", addr, Explain(err))
	}
	hello := h.Encode()
	buf := make([]byte, 64)
	for try := 0; try < 10; try++ {
		if ctx.Err() != nil {
			nc.Close()
			return nil, ErrInterrupted
		}
		if _, err := nc.Write(hello); err != nil {
			nc.Close()
			return nil, fmt.Errorf("connect (udp) %s: %w", addr, Explain(err))
		}
		_ = nc.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		n, err := nc.Read(buf)
		if err == nil {
			if got, herr := DecodeHeader(buf[:n]); herr == nil && got == h {
				_ = nc.SetReadDeadline(time.Time{})
				return NewConn(nc, o), nil
			}
			continue
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			continue
		}
		nc.Close()
		return nil, fmt.Errorf("connect (udp) %s: %w", addr, Explain(err))
	}
	nc.Close()
	return nil, fmt.Errorf("connect (udp) %s: no answer to the hello after 10 tries", addr)
}
