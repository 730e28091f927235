package dataconn

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

func TestHeader(t *testing.T) {
	h := Header{RunID: 7, Strand: 249, Conn: 65536}
	got, err := DecodeHeader(h.Encode())
	if err != nil || got != h {
		t.Fatalf("%+v %v", got, err)
	}
	if _, err := DecodeHeader([]byte("GET / HTTP/1.1\r\n")); err == nil {
		t.Fatal("foreign bytes accepted as a header")
	}
}

func TestThink(t *testing.T) {
	start := time.Now()
	if err := Think(30*time.Millisecond, false, nil); err != nil || time.Since(start) < 30*time.Millisecond {
		t.Fatalf("idle think: %v after %v", err, time.Since(start))
	}
	start = time.Now()
	if err := Think(20*time.Millisecond, true, nil); err != nil || time.Since(start) < 20*time.Millisecond {
		t.Fatalf("busy think: %v after %v", err, time.Since(start))
	}
	cancel := make(chan struct{})
	close(cancel)
	for _, busy := range []bool{false, true} {
		start = time.Now()
		if err := Think(time.Hour, busy, cancel); !errors.Is(err, ErrInterrupted) || time.Since(start) > time.Second {
			t.Fatalf("cancelled think (busy %v): %v", busy, err)
		}
	}
}

// tcpPair is a connected loopback TCP pair: nc, the dialled side (to wrap
// in a Conn), and its accepted peer.
func tcpPair(t *testing.T) (nc, peer net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() { c, _ := ln.Accept(); accepted <- c }()
	nc, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	return nc, <-accepted
}

// connInMode is a TCP connection and its peer, the connection in blocking
// mode or not.
func connInMode(t *testing.T, blocking bool) (*Conn, net.Conn) {
	nc, p := tcpPair(t)
	c := NewConn(nc, Options{Protocol: "tcp"})
	if blocking {
		if err := c.SetBlocking(); err != nil {
			t.Fatal(err)
		}
	}
	return c, p
}

// Interrupt unblocks a read in both I/O modes, and Resume makes the
// connection usable again.
func TestInterruptAndResume(t *testing.T) {
	for _, blocking := range []bool{false, true} {
		c, p := connInMode(t, blocking)
		go func() { time.Sleep(50 * time.Millisecond); c.Interrupt() }()
		start := time.Now()
		buf := make([]byte, 10)
		if _, err := c.Read(buf); !errors.Is(err, ErrInterrupted) {
			t.Fatalf("blocking=%v: read returned %v", blocking, err)
		}
		if el := time.Since(start); el > 50*time.Millisecond+2*BlockingTick {
			t.Fatalf("blocking=%v: interrupt took %v", blocking, el)
		}
		c.Resume()
		go p.Write([]byte("0123456789"))
		if n, err := c.Read(buf); err != nil || n != 10 {
			t.Fatalf("blocking=%v: after resume: %d %v", blocking, n, err)
		}
		if n, err := c.Write(buf[:4]); err != nil || n != 4 {
			t.Fatalf("write: %d %v", n, err)
		}
		p.Close()
		if _, err := c.Read(buf); err == nil || errors.Is(err, ErrInterrupted) {
			t.Fatalf("blocking=%v: read from a closed peer: %v", blocking, err)
		}
		c.Close()
	}
}

func TestPerOperationTimeout(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	defer ln.Close()
	go func() { c, _ := ln.Accept(); time.Sleep(2 * time.Second); c.Close() }()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	for _, blocking := range []bool{false, true} {
		c := NewConn(nc, Options{Protocol: "tcp", Timeout: 150 * time.Millisecond})
		if blocking {
			c.SetBlocking()
		}
		start := time.Now()
		_, err := c.Read(make([]byte, 1))
		if err == nil || errors.Is(err, ErrInterrupted) || time.Since(start) > time.Second {
			t.Fatalf("blocking=%v: %v after %v", blocking, err, time.Since(start))
		}
	}
	nc.Close()
}

// A write that waits for room in a send buffer the peer never drains ends
// at SetUntil's bound in both I/O modes, with ErrDeadline, and the
// connection is usable again once the bound is lifted.
func TestUntilEndsABlockedWrite(t *testing.T) {
	for _, blocking := range []bool{false, true} {
		c, p := connInMode(t, blocking)
		bound := time.Now().Add(300 * time.Millisecond)
		c.SetUntil(bound)
		buf := make([]byte, 1<<20)
		var werr error
		for werr == nil && time.Now().Before(bound.Add(5*time.Second)) {
			_, werr = c.Write(buf) // the peer reads nothing: the buffers fill, then a write blocks
		}
		if !errors.Is(werr, ErrDeadline) {
			t.Fatalf("blocking=%v: blocked write ended with %v", blocking, werr)
		}
		if late := time.Since(bound); late > 2*BlockingTick+100*time.Millisecond {
			t.Fatalf("blocking=%v: the write ended %v after the bound", blocking, late)
		}
		c.SetUntil(time.Time{})
		go func() { _, _ = io.Copy(io.Discard, p) }()
		if n, err := c.Write(buf[:1000]); err != nil || n != 1000 {
			t.Fatalf("blocking=%v: write after the bound was lifted: %d %v", blocking, n, err)
		}
		if r := c.Retransmits(); r < 0 {
			t.Fatalf("retransmits %d", r)
		}
		c.Close()
		p.Close()
	}
}

func TestAcceptorRoutesByHeader(t *testing.T) {
	var fatal error
	a, err := Listen("127.0.0.1", 0, 0, 42, func(e error) { fatal = e })
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(a.Port()))
	// a stranger and a wrong run id are dropped
	s, _ := net.Dial("tcp", addr)
	s.Write([]byte("hello there, not netload"))
	defer s.Close()
	if _, err := Dial(context.Background(), addr, Header{RunID: 41, Strand: 1, Conn: 0}, Options{Protocol: "tcp"}); err != nil {
		t.Fatal(err)
	}
	// two strands connect in the opposite order to the accepts
	c2, err := Dial(context.Background(), addr, Header{RunID: 42, Strand: 2, Conn: 0}, Options{Protocol: "tcp"})
	if err != nil {
		t.Fatal(err)
	}
	c1, err := Dial(context.Background(), addr, Header{RunID: 42, Strand: 1, Conn: 0}, Options{Protocol: "tcp"})
	if err != nil {
		t.Fatal(err)
	}
	got1, err := a.Accept(Key{1, 0}, Options{Protocol: "tcp"}, nil, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	got2, err := a.Accept(Key{2, 0}, Options{Protocol: "tcp"}, nil, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c1.Write([]byte("1"))
	c2.Write([]byte("2"))
	b := make([]byte, 1)
	if got1.Read(b); b[0] != '1' {
		t.Fatal("strand 1 got strand 2's connection")
	}
	if got2.Read(b); b[0] != '2' {
		t.Fatal("strand 2 got strand 1's connection")
	}
	if _, err := a.Accept(Key{1, 0}, Options{Protocol: "tcp"}, nil, 100*time.Millisecond); err == nil {
		t.Fatal("the wrong run id's connection was handed out")
	}
	cancel := make(chan struct{})
	close(cancel)
	if _, err := a.Accept(Key{9, 9}, Options{Protocol: "tcp"}, cancel, 0); !errors.Is(err, ErrInterrupted) {
		t.Fatalf("cancelled accept: %v", err)
	}
	if fatal != nil {
		t.Fatal(fatal)
	}
}

// emfileListener fails every Accept the way a process out of descriptors does.
type emfileListener struct{ net.Listener }

func (l emfileListener) Accept() (net.Conn, error) {
	return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
}

func TestAcceptorOutOfDescriptors(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	a := newAcceptor(emfileListener{ln}, 1, func(e error) { got <- e })
	defer a.Close()
	select {
	case e := <-got:
		for _, want := range []string{"too many open files", "ulimit -n"} {
			if !strings.Contains(e.Error(), want) {
				t.Errorf("%q does not mention %q", e, want)
			}
		}
	case <-time.After(2 * time.Second):
		t.Fatal("EMFILE on accept was not reported")
	}
}

// A strand that reconnects in a loop can be several connections ahead of
// the accepting strand: they wait in its mailbox (up to mailboxDepth)
// instead of being dropped.
func TestAcceptorQueuesReconnectsForOneStrand(t *testing.T) {
	a, err := Listen("127.0.0.1", 0, 0, 7, func(error) {})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(a.Port()))
	const n = 5
	for i := 0; i < n; i++ {
		c, err := Dial(context.Background(), addr, Header{RunID: 7, Strand: 3, Conn: 1}, Options{Protocol: "tcp"})
		if err != nil {
			t.Fatal(err)
		}
		c.Close() // connect, disconnect, connect again, as uperf's connect.xml does
	}
	for i := 0; i < n; i++ {
		c, err := a.Accept(Key{3, 1}, Options{Protocol: "tcp"}, nil, 2*time.Second)
		if err != nil {
			t.Fatalf("accept %d of %d: %v", i+1, n, err)
		}
		c.Close()
	}
}

// epollTargets lists the descriptors registered with any epoll instance of
// this process (the runtime's poller among them), from /proc/self/fdinfo.
func epollTargets(t *testing.T) map[int]bool {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	out := map[int]bool{}
	for _, e := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err != nil || l != "anon_inode:[eventpoll]" {
			continue
		}
		info, err := os.ReadFile("/proc/self/fdinfo/" + e.Name())
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(info), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "tfd:" {
				if n, err := strconv.Atoi(f[1]); err == nil {
					out[n] = true
				}
			}
		}
	}
	return out
}

func rawFD(t *testing.T, rc syscall.RawConn) int {
	t.Helper()
	fd := -1
	if err := rc.Control(func(u uintptr) { fd = int(u) }); err != nil {
		t.Fatal(err)
	}
	return fd
}

// In blocking mode the socket is no longer registered with Go's poller
// (which would otherwise be woken for every message), it blocks, and the
// original descriptor is gone.
func TestBlockingSocketLeavesThePoller(t *testing.T) {
	nc, p := tcpPair(t)
	defer p.Close()
	sc, _ := nc.(*net.TCPConn).SyscallConn()
	before := rawFD(t, sc)
	if !epollTargets(t)[before] {
		t.Fatalf("test premise: fd %d of a new connection is not in the poller", before)
	}
	c := NewConn(nc, Options{Protocol: "tcp"})
	if err := c.SetBlocking(); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	after := c.fd
	if targets := epollTargets(t); targets[after] {
		t.Fatalf("blocking socket (fd %d) is still registered with the poller", after)
	}
	if fl, err := unixFcntl(after, syscall.F_GETFL); err != nil || fl&syscall.O_NONBLOCK != 0 {
		t.Fatalf("socket flags %#x, %v: not blocking", fl, err)
	}
	if after != before {
		if _, err := unixFcntl(before, syscall.F_GETFD); err != syscall.EBADF {
			t.Fatalf("the original descriptor %d is still open (%v)", before, err)
		}
	}
	go p.Write([]byte("ping"))
	buf := make([]byte, 4)
	if n, err := c.Read(buf); err != nil || string(buf[:n]) != "ping" {
		t.Fatalf("read %q %v", buf[:n], err)
	}
	if n, err := c.Write([]byte("pong")); err != nil || n != 4 {
		t.Fatalf("write %d %v", n, err)
	}
	if _, err := io.ReadFull(p, buf); err != nil || string(buf) != "pong" {
		t.Fatalf("peer read %q %v", buf, err)
	}
}

func unixFcntl(fd, cmd int) (int, error) {
	r, _, e := syscall.Syscall(syscall.SYS_FCNTL, uintptr(fd), uintptr(cmd), 0)
	if e != 0 {
		return -1, e
	}
	return int(r), nil
}

// Closing a blocking connection while a read waits on it ends that read
// (within a tick) with an error, and its descriptor is released after.
func TestBlockingCloseDuringRead(t *testing.T) {
	nc, p := tcpPair(t)
	defer p.Close()
	c := NewConn(nc, Options{Protocol: "tcp"})
	if err := c.SetBlocking(); err != nil {
		t.Fatal(err)
	}
	fd := c.fd
	done := make(chan error, 1)
	go func() { _, err := c.Read(make([]byte, 8)); done <- err }()
	time.Sleep(20 * time.Millisecond)
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * BlockingTick):
		t.Fatal("Close waits for the read in progress")
	}
	select {
	case err := <-done:
		if err == nil || errors.Is(err, ErrInterrupted) {
			t.Fatalf("read on a closed connection: %v", err)
		}
	case <-time.After(10 * BlockingTick):
		t.Fatal("a read on a closed blocking connection did not end")
	}
	if _, err := unixFcntl(fd, syscall.F_GETFD); err != syscall.EBADF {
		t.Fatalf("descriptor %d still open after Close and the read's end (%v)", fd, err)
	}
}

// congestion reads a socket's TCP_CONGESTION (the syscall package has no
// GetsockoptString).
func congestion(t *testing.T, c *Conn) string {
	t.Helper()
	raw, err := c.nc.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	n := uint32(len(buf))
	var errno syscall.Errno
	raw.Control(func(fd uintptr) {
		_, _, errno = syscall.Syscall6(syscall.SYS_GETSOCKOPT, fd, syscall.IPPROTO_TCP, syscall.TCP_CONGESTION,
			uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&n)), 0)
	})
	if errno != 0 {
		t.Fatal(errno)
	}
	return strings.TrimRight(string(buf[:n]), "\x00")
}

// uperf's cc= option sets TCP_CONGESTION on both ends; one the kernel
// refuses fails the connection with the reason and what the kernel has.
func TestCongestionControlOption(t *testing.T) {
	a, err := Listen("127.0.0.1", 0, 0, 5, func(error) {})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(a.Port()))
	o := Options{Protocol: "tcp", CC: "reno"} // built into every kernel, and not the default
	c, err := Dial(context.Background(), addr, Header{RunID: 5, Strand: 1}, o)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := a.Accept(Key{1, 0}, o, nil, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got, want := congestion(t, c), "reno"; got != want {
		t.Fatalf("client socket: %q, want %q", got, want)
	}
	if got := congestion(t, s); got != "reno" {
		t.Fatalf("server socket: %q", got)
	}
	plain, err := Dial(context.Background(), addr, Header{RunID: 5, Strand: 2}, Options{Protocol: "tcp"})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	def, _ := os.ReadFile("/proc/sys/net/ipv4/tcp_congestion_control")
	if got := congestion(t, plain); got != strings.TrimSpace(string(def)) {
		t.Fatalf("without cc=: %q, want the system default %q", got, def)
	}
	_, err = Dial(context.Background(), addr, Header{RunID: 5, Strand: 3}, Options{Protocol: "tcp", CC: "nosuchcc"})
	if err == nil || !strings.Contains(err.Error(), `congestion control "nosuchcc" cannot be set`) ||
		!strings.Contains(err.Error(), "this kernel offers: ") {
		t.Fatalf("unknown congestion control: %v", err)
	}
}

// inQueue is the number of bytes waiting in a socket's receive queue
// (SIOCINQ, which Linux numbers as TIOCINQ/FIONREAD).
func inQueue(t *testing.T, c *Conn) int {
	t.Helper()
	var queued int32
	n, _, e := syscall.Syscall(syscall.SYS_IOCTL, uintptr(c.fd), syscall.TIOCINQ, uintptr(unsafe.Pointer(&queued)))
	if e != 0 || n != 0 {
		t.Fatalf("SIOCINQ: %v", e)
	}
	return int(queued)
}

// blockingPair returns a blocking-mode TCP Conn and its peer, both closed
// when the test ends.
func blockingPair(t *testing.T) (*Conn, net.Conn) {
	t.Helper()
	nc, p := tcpPair(t)
	t.Cleanup(func() { p.Close() })
	c := NewConn(nc, Options{Protocol: "tcp"})
	t.Cleanup(func() { c.Close() })
	if err := c.SetBlocking(); err != nil {
		t.Fatal(err)
	}
	return c, p
}

// In blocking mode, Discard takes the socket's whole receive queue (up to a
// few messages) in one read(2), and the next calls consume it without
// another; the stream's bytes stay in order for a Read that follows.
func TestBlockingDiscardReadsAhead(t *testing.T) {
	c, p := blockingPair(t)
	const size = 1000
	msg := make([]byte, 3*size)
	copy(msg[2*size:], "third message")
	if _, err := p.Write(msg); err != nil {
		t.Fatal(err)
	}
	// the three messages left in one write; wait until all have arrived
	for deadline := time.Now().Add(5 * time.Second); inQueue(t, c) < len(msg); {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d bytes arrived", inQueue(t, c), len(msg))
		}
		time.Sleep(time.Millisecond)
	}
	scratch := make([]byte, size)
	if n, err := c.Discard(size, scratch); n != size || err != nil {
		t.Fatalf("discard: %d %v", n, err)
	}
	if q := inQueue(t, c); q != 0 {
		t.Fatalf("%d bytes still in the socket after the first Discard: it did not read ahead", q)
	}
	if n, err := c.Discard(size, scratch); n != size || err != nil {
		t.Fatalf("second discard: %d %v", n, err)
	}
	buf := make([]byte, size)
	if n, err := c.Read(buf); n != size || err != nil || string(buf[:13]) != "third message" {
		t.Fatalf("read after discards: %d %v %q", n, err, buf[:13])
	}
	// a message split over two writes is still whole, and the peer's close ends the stream
	go func() {
		p.Write(make([]byte, size/2))
		time.Sleep(20 * time.Millisecond)
		p.Write(make([]byte, size/2))
		p.Close()
	}()
	if n, err := c.Discard(size, scratch); n != size || err != nil {
		t.Fatalf("discard of a split message: %d %v", n, err)
	}
	if _, err := c.Discard(size, scratch); err == nil {
		t.Fatal("discard after the peer closed: no error")
	}
}

// lowatOf reads the socket's SO_RCVLOWAT and SO_RCVTIMEO back.
func lowatOf(t *testing.T, c *Conn) (int, time.Duration) {
	t.Helper()
	lowat, err := syscall.GetsockoptInt(c.fd, syscall.SOL_SOCKET, syscall.SO_RCVLOWAT)
	if err != nil {
		t.Fatal(err)
	}
	var tv syscall.Timeval
	size := uint32(unsafe.Sizeof(tv))
	if _, _, e := syscall.Syscall6(syscall.SYS_GETSOCKOPT, uintptr(c.fd), syscall.SOL_SOCKET, syscall.SO_RCVTIMEO,
		uintptr(unsafe.Pointer(&tv)), uintptr(unsafe.Pointer(&size)), 0); e != 0 {
		t.Fatal(e)
	}
	return lowat, time.Duration(tv.Nano())
}

// coalescing tells a CoalesceTick read back from SO_RCVTIMEO: the kernel
// rounds it up to its clock tick (4 ms at HZ=250, 10 ms at 100).
func coalescing(tick time.Duration) bool { return tick >= CoalesceTick && tick <= 10*time.Millisecond }

// threadSleeps counts the calling thread's voluntary context switches.
func threadSleeps(t *testing.T) int64 {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(1 /* RUSAGE_THREAD */, &ru); err != nil {
		t.Fatal(err)
	}
	return ru.Nvcsw
}

// A streaming receiver that is faster than its sender sleeps once per
// StreamLowat bytes (or CoalesceTick), not once per message: 128 messages
// of 1,000 bytes sent 50 us apart, each in its own segment, wake it a few
// times, where a receiver waking on every arrival sleeps about 128 times.
func TestStreamingReceiverSleepsPerLowat(t *testing.T) {
	const size, count = 1000, 128
	for _, streaming := range []bool{true, false} {
		nc, p := tcpPair(t)
		p.(*net.TCPConn).SetNoDelay(true)
		c := NewConn(nc, Options{Protocol: "tcp"})
		if err := c.SetBlocking(); err != nil {
			t.Fatal(err)
		}
		c.SetStreaming(streaming)
		go func() {
			msg := make([]byte, size)
			for i := 0; i < count; i++ {
				p.Write(msg)
				for t0 := time.Now(); time.Since(t0) < 50*time.Microsecond; {
				}
			}
		}()
		runtime.LockOSThread()
		scratch := make([]byte, size)
		before := threadSleeps(t)
		for i := 0; i < count; i++ {
			if n, err := c.Discard(size, scratch); n != size || err != nil {
				t.Fatalf("discard %d: %d %v", i, n, err)
			}
		}
		sleeps := threadSleeps(t) - before
		runtime.UnlockOSThread()
		lowat, tick := lowatOf(t, c)
		t.Logf("streaming %v: %d sleeps for %d messages; SO_RCVLOWAT %d, SO_RCVTIMEO %v", streaming, sleeps, count, lowat, tick)
		if streaming {
			if sleeps > count/4 {
				t.Errorf("a streaming receiver slept %d times for %d messages of %d bytes", sleeps, count, size)
			}
			if lowat < size || lowat > StreamLowat || !coalescing(tick) {
				t.Errorf("streaming: SO_RCVLOWAT %d, SO_RCVTIMEO %v", lowat, tick)
			}
		} else if lowat != 1 || tick != BlockingTick {
			t.Errorf("not streaming: SO_RCVLOWAT %d, SO_RCVTIMEO %v", lowat, tick)
		}
		c.Close()
		p.Close()
	}
}

// SO_RCVLOWAT stays within a quarter of the receive buffer (a larger one
// would make Linux grow the buffer and clamp the window), and a stream
// that ends leaves its last message waiting a CoalesceTick or so, not a
// BlockingTick; the quiet read puts the socket back to waking on every
// segment, and SetStreaming(false) does too.
func TestStreamingReceiverBounds(t *testing.T) {
	c, p := blockingPair(t)
	c.SetStreaming(true)
	const size = 1000
	scratch := make([]byte, size)
	if _, err := p.Write(make([]byte, size)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if n, err := c.Discard(size, scratch); n != size || err != nil {
		t.Fatalf("discard: %d %v", n, err)
	}
	if took := time.Since(start); took > BlockingTick/2 {
		t.Errorf("the last message of a stream waited %v", took)
	}
	rcvbuf, err := syscall.GetsockoptInt(c.fd, syscall.SOL_SOCKET, syscall.SO_RCVBUF)
	if err != nil {
		t.Fatal(err)
	}
	if lowat, _ := lowatOf(t, c); lowat > rcvbuf/4 || lowat < MinLowat {
		t.Errorf("SO_RCVLOWAT %d with a receive buffer of %d", lowat, rcvbuf)
	}
	// the peer pauses for several ticks before the next message
	go func() {
		time.Sleep(20 * CoalesceTick)
		p.Write(make([]byte, size))
	}()
	if n, err := c.Discard(size, scratch); n != size || err != nil {
		t.Fatalf("discard after a pause: %d %v", n, err)
	}
	if lowat, tick := lowatOf(t, c); lowat != 1 || tick != BlockingTick {
		t.Errorf("after a pause: SO_RCVLOWAT %d, SO_RCVTIMEO %v", lowat, tick)
	}
	// the next message raises it again, and SetStreaming(false) lowers it
	p.Write(make([]byte, size))
	if n, err := c.Discard(size, scratch); n != size || err != nil {
		t.Fatalf("discard: %d %v", n, err)
	}
	if lowat, tick := lowatOf(t, c); lowat < MinLowat || !coalescing(tick) {
		t.Errorf("streaming again: SO_RCVLOWAT %d, SO_RCVTIMEO %v", lowat, tick)
	}
	c.SetStreaming(false)
	if lowat, tick := lowatOf(t, c); lowat != 1 || tick != BlockingTick {
		t.Errorf("after SetStreaming(false): SO_RCVLOWAT %d, SO_RCVTIMEO %v", lowat, tick)
	}
}

// A small receive buffer set by hand (uperf's wndsz) leaves no room for a
// lowat worth having: the receiver wakes on every segment, as before.
func TestStreamingReceiverLeavesASmallWindowAlone(t *testing.T) {
	nc, p := tcpPair(t)
	defer p.Close()
	if err := nc.(*net.TCPConn).SetReadBuffer(16384); err != nil {
		t.Fatal(err)
	}
	c := NewConn(nc, Options{Protocol: "tcp", WndSz: 16384})
	defer c.Close()
	if err := c.SetBlocking(); err != nil {
		t.Fatal(err)
	}
	c.SetStreaming(true)
	const size = 1000
	scratch := make([]byte, size)
	for i := 0; i < 3; i++ {
		p.Write(make([]byte, size))
		if n, err := c.Discard(size, scratch); n != size || err != nil {
			t.Fatalf("discard: %d %v", n, err)
		}
		if lowat, tick := lowatOf(t, c); lowat != 1 || tick != BlockingTick {
			t.Errorf("a 16 KiB window: SO_RCVLOWAT %d, SO_RCVTIMEO %v", lowat, tick)
		}
	}
}
