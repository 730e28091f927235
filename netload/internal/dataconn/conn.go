// Package dataconn holds the data-path side of netload: connections (TCP
// and UDP) with uperf's socket options, the acceptor that routes incoming
// data connections to the strand waiting for them, and the operations a
// flowop performs on them (read, write, think).
package dataconn

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"
)

// HeaderSize is the size of the hello a connecting side sends first on
// every data connection (TCP) or as its first datagram (UDP). It is not
// counted as payload.
const HeaderSize = 16

var headerMagic = [4]byte{'n', 'l', 'd', '1'}

// Header names the strand and connection a data connection belongs to.
type Header struct {
	RunID  uint32
	Strand uint32
	Conn   uint32
}

// Encode writes h into a HeaderSize buffer.
func (h Header) Encode() []byte {
	b := make([]byte, HeaderSize)
	copy(b, headerMagic[:])
	binary.BigEndian.PutUint32(b[4:], h.RunID)
	binary.BigEndian.PutUint32(b[8:], h.Strand)
	binary.BigEndian.PutUint32(b[12:], h.Conn)
	return b
}

// DecodeHeader parses a header.
func DecodeHeader(b []byte) (Header, error) {
	if len(b) != HeaderSize || [4]byte(b[:4]) != headerMagic {
		return Header{}, errors.New("not a netload data connection")
	}
	return Header{
		RunID:  binary.BigEndian.Uint32(b[4:]),
		Strand: binary.BigEndian.Uint32(b[8:]),
		Conn:   binary.BigEndian.Uint32(b[12:]),
	}, nil
}

// Options are the socket options of a connect/accept flowop.
type Options struct {
	Protocol string // "tcp" or "udp"
	NoDelay  bool
	WndSz    int
	CC       string        // TCP congestion control; "" keeps the system's default
	Timeout  time.Duration // per-operation timeout (0 = none)
}

// Conn is one data connection.
//
// A TCP connection works in one of two I/O modes. In "poll" mode it uses
// Go's runtime poller (a blocked read parks the goroutine; fine for
// thousands of connections). In "blocking" mode the socket is switched to
// blocking I/O and the strand's thread sleeps in read(2)/write(2) like
// uperf's and sockperf's do, which saves the poller's extra system calls
// and wake-ups on every message: the faster choice when there are fewer
// strands than a few per CPU. Blocking sockets get SO_RCVTIMEO and
// SO_SNDTIMEO of BlockingTick, so an Interrupt is noticed within one tick.
type Conn struct {
	nc      net.Conn
	udp     bool
	timeout time.Duration
	// blocking mode: the socket's own descriptor, outside Go's poller
	// (-1 otherwise), and its users (fdState).
	fd      int
	fdState atomic.Uint32

	mu          sync.Mutex
	interrupted bool
	intr        atomic.Bool // mirror of interrupted for the blocking loops

	// until, when set, is the end of the timed transaction using this
	// connection: an operation still blocked then ends with ErrDeadline.
	// Only the owning strand sets it, between its own operations.
	until time.Time
	// lastRetrans is TCP_INFO's total_retrans when Retransmits last looked.
	lastRetrans uint32
	// Blocking mode read-ahead (Discard): bytes taken from the socket
	// beyond the message being discarded, ahead[aheadOff:aheadOff+aheadLen],
	// which the next reads consume first.
	ahead              []byte
	aheadOff, aheadLen int
	// Streaming receiver (SetStreaming): stream is the owner's promise to
	// only read; lowat is the SO_RCVLOWAT in force (0: the kernel's 1);
	// lookIn counts down the reads until the receive buffer is looked at
	// again (coalesce). fixedBuf: the buffer was set (wndsz), so
	// autotuning never grows it and one look is enough.
	stream   bool
	lowat    int
	lookIn   int
	fixedBuf bool
}

// BlockingTick bounds how long a blocking-mode operation sleeps before it
// looks at the interrupt flag again.
const BlockingTick = 100 * time.Millisecond

// NewConn wraps an established connection.
func NewConn(nc net.Conn, o Options) *Conn {
	return &Conn{nc: nc, udp: o.Protocol == "udp", timeout: o.Timeout, fd: -1, fixedBuf: o.WndSz > 0}
}

// fdState of a blocking-mode Conn: fdClosed once Close was called, plus
// fdUser for each operation using the descriptor. The last one out closes
// it, so a descriptor number is never reused under an operation.
const (
	fdClosed = 1
	fdUser   = 2
)

// acquireFD registers an operation on the descriptor (false once closed).
func (c *Conn) acquireFD() bool {
	for {
		st := c.fdState.Load()
		if st&fdClosed != 0 {
			return false
		}
		if c.fdState.CompareAndSwap(st, st+fdUser) {
			return true
		}
	}
}

// releaseFD ends an operation, and closes the descriptor if Close came
// meanwhile.
func (c *Conn) releaseFD() {
	if c.fdState.Add(^uint32(fdUser-1)) == fdClosed {
		_ = syscall.Close(c.fd)
	}
}

// SetBlocking switches a TCP connection to blocking I/O (see Conn).
//
// The socket also leaves Go's poller: it moves to a duplicate descriptor
// that was never registered with epoll, and the original is closed. A
// socket still registered would wake the runtime's poller thread on every
// message it receives or sends (edge-triggered epoll), for nothing, since no
// goroutine ever waits there in blocking mode.
func (c *Conn) SetBlocking() error {
	sc, ok := c.nc.(syscall.Conn)
	if !ok || c.udp {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return err
	}
	tv := syscall.NsecToTimeval(BlockingTick.Nanoseconds())
	nfd := -1
	var serr error
	err = rc.Control(func(fd uintptr) {
		r, _, e := syscall.Syscall(syscall.SYS_FCNTL, fd, syscall.F_DUPFD_CLOEXEC, 0)
		if e != 0 {
			serr = fmt.Errorf("dup: %w", e)
			return
		}
		nfd = int(r)
		if e := syscall.SetNonblock(nfd, false); e != nil {
			serr = e
			return
		}
		if e := syscall.SetsockoptTimeval(nfd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &tv); e != nil {
			serr = e
			return
		}
		serr = syscall.SetsockoptTimeval(nfd, syscall.SOL_SOCKET, syscall.SO_SNDTIMEO, &tv)
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		if nfd >= 0 {
			syscall.Close(nfd)
		}
		return fmt.Errorf("blocking I/O: %w", err)
	}
	// Closing the original removes it from epoll; the socket lives on in nfd.
	_ = c.nc.Close()
	c.fd = nfd
	return nil
}

// blockingIO runs read(2) or write(2) on buf until it is done, the
// connection is interrupted or closed, the per-operation timeout passes or
// an error occurs. It returns the bytes moved. It calls the system
// directly on the descriptor: no poller, no callback, no allocation.
func (c *Conn) blockingIO(op string, buf []byte, write bool) (int, error) {
	if !c.acquireFD() {
		return 0, fmt.Errorf("%s: connection closed", op)
	}
	defer c.releaseFD()
	var start time.Time
	if c.timeout > 0 {
		start = time.Now()
	}
	done := 0
	if !write {
		done = c.takeAhead(buf)
	}
	for done < len(buf) {
		var n int
		var err error
		if write {
			n, err = syscall.Write(c.fd, buf[done:])
		} else {
			n, err = syscall.Read(c.fd, buf[done:])
		}
		if n > 0 {
			done += n
		}
		if stop, err := c.afterIO(op, n, err, done < len(buf), write, start); stop {
			return done, err
		}
	}
	return done, nil
}

// afterIO decides, after one read(2) or write(2) that moved n bytes and
// left the operation incomplete or not, whether the operation stops here
// and with which error.
func (c *Conn) afterIO(op string, n int, err error, incomplete, write bool, start time.Time) (bool, error) {
	if !c.until.IsZero() && (err == syscall.EAGAIN || (err == nil && n > 0 && incomplete)) && !time.Now().Before(c.until) {
		return true, ErrDeadline
	}
	switch {
	case err == syscall.EINTR:
		return false, nil
	case err == syscall.EAGAIN:
		// a BlockingTick passed with nothing moved
		if c.intr.Load() {
			return true, ErrInterrupted
		}
		if c.fdState.Load()&fdClosed != 0 {
			return true, fmt.Errorf("%s: connection closed", op)
		}
		if c.timeout > 0 && time.Since(start) >= c.timeout {
			return true, fmt.Errorf("%s: timed out after %v", op, c.timeout)
		}
	case err != nil:
		return true, c.classify(op, err)
	case n == 0 && !write:
		return true, c.classify(op, io.EOF)
	}
	return false, nil
}

// takeAhead moves bytes read ahead by Discard into buf; it returns how many.
func (c *Conn) takeAhead(buf []byte) int {
	n := copy(buf, c.ahead[c.aheadOff:c.aheadOff+c.aheadLen])
	c.consumeAhead(n)
	return n
}

func (c *Conn) consumeAhead(n int) {
	c.aheadOff += n
	c.aheadLen -= n
	if c.aheadLen == 0 {
		c.aheadOff = 0
	}
}

// aheadSize is the read-ahead buffer for messages of size bytes: room for
// a few of them, within 256 KiB; a streaming receiver's is 256 KiB, room
// for its largest SO_RCVLOWAT and more.
func (c *Conn) aheadSize(size int) int {
	if c.stream {
		return max(size, 256<<10)
	}
	return max(size, min(4*size, 256<<10))
}

// A streaming receiver sleeps until StreamLowat bytes are queued
// (SO_RCVLOWAT), at most a quarter of its receive buffer, so that the
// kernel never grows the buffer for it, nor clamps the window (Linux's
// tcp_set_rcvlowat does both for a larger one), and not at all where that
// quarter is below MinLowat: the few wake-ups it would save are not worth
// holding back a small window's worth of data. CoalesceTick (its
// SO_RCVTIMEO) bounds how long data that has arrived waits for more: the
// kernel rounds it up to its clock tick and its timers add up to one
// more, so one to two ticks (4-8 ms at HZ=250, 10-20 ms at HZ=100).
const (
	StreamLowat  = 160 << 10
	MinLowat     = 32 << 10
	CoalesceTick = 2 * time.Millisecond
	// the receive buffer grows while a stream starts (autotuning): it is
	// looked at again every lowatRecheck reads until it allows StreamLowat
	lowatRecheck = 16
	never        = math.MaxInt
)

// SetStreaming says that the connection's owner will, until it says
// otherwise, only read from it, message after message, with no pause of
// its own: the receiving side of a stream. Discard then lets the kernel
// wake it once per StreamLowat bytes instead of once per arriving segment
// (see Discard). A stream that pauses or ends costs its receiver at most a
// CoalesceTick as the kernel counts it (4-8 ms at HZ=250): the first read
// that waits that long with nothing arriving goes back to waking on every
// segment until the next message. A no-op outside blocking mode.
func (c *Conn) SetStreaming(on bool) {
	if c.fd < 0 || c.stream == on || !c.acquireFD() {
		return
	}
	defer c.releaseFD()
	c.stream = on
	c.lookIn = 0
	if !on && c.lowat > 0 {
		c.setLowat(0)
	}
}

// setLowat sets SO_RCVLOWAT to lowat bytes with SO_RCVTIMEO CoalesceTick,
// or, for 0, back to the kernel's 1 byte and BlockingTick. A socket that
// refuses stays as it was (the stream is then received as before).
func (c *Conn) setLowat(lowat int) {
	tick := BlockingTick
	if lowat > 0 {
		tick = CoalesceTick
	}
	tv := syscall.NsecToTimeval(tick.Nanoseconds())
	if syscall.SetsockoptInt(c.fd, syscall.SOL_SOCKET, syscall.SO_RCVLOWAT, max(lowat, 1)) != nil {
		return
	}
	if syscall.SetsockoptTimeval(c.fd, syscall.SOL_SOCKET, syscall.SO_RCVTIMEO, &tv) != nil {
		_ = syscall.SetsockoptInt(c.fd, syscall.SOL_SOCKET, syscall.SO_RCVLOWAT, max(c.lowat, 1))
		return
	}
	c.lowat = lowat
}

// coalesce raises SO_RCVLOWAT as far as the receive buffer allows now.
func (c *Conn) coalesce() {
	c.lookIn = lowatRecheck
	if c.fixedBuf {
		c.lookIn = never
	}
	rcvbuf, err := syscall.GetsockoptInt(c.fd, syscall.SOL_SOCKET, syscall.SO_RCVBUF)
	if err != nil {
		c.lookIn = never
		return
	}
	if want := min(StreamLowat, rcvbuf/4); want > c.lowat && want >= MinLowat {
		c.setLowat(want)
	}
}

// Discard receives one message of n bytes (TCP: all of them; UDP: one
// datagram of at most n) whose content nobody looks at. scratch (at least
// n bytes) receives it in poll mode and for UDP.
//
// In blocking mode Discard reads ahead: one read(2) takes whatever the
// socket holds, up to a few messages, and the next calls consume that
// first. A stream's receiver then makes a system call, and sleeps, once per
// several messages instead of once per message or per segment. That is
// cheaper for the receiver and for the sender too: on loopback the
// sender's CPU runs the receiver's TCP input, and wakes the receiver, for
// every segment that arrives while the receiver is asleep in a read, and
// waking an idle CPU costs an interrupt. The bytes in the stream, and the
// messages counted, are the same; Read, too, takes read-ahead bytes first.
//
// A streaming receiver (SetStreaming) also raises SO_RCVLOWAT, so that it
// sleeps until StreamLowat bytes have arrived, not until the next segment:
// a receiver faster than its sender otherwise catches up, and sleeps,
// every segment or two.
func (c *Conn) Discard(n int, scratch []byte) (int, error) {
	if c.fd < 0 {
		return c.Read(scratch[:n])
	}
	if !c.acquireFD() {
		return 0, errors.New("read: connection closed")
	}
	defer c.releaseFD()
	done := min(n, c.aheadLen)
	c.consumeAhead(done)
	if done == n {
		return n, nil
	}
	if len(c.ahead) < c.aheadSize(n) {
		c.ahead = make([]byte, c.aheadSize(n))
	}
	if c.stream && c.lowat < StreamLowat && c.lookIn <= 0 {
		c.coalesce()
	}
	var start time.Time
	if c.timeout > 0 {
		start = time.Now()
	}
	for done < n {
		// nothing is left ahead here, so the whole buffer is free
		got, err := syscall.Read(c.fd, c.ahead)
		if c.stream {
			c.lookIn--
		}
		if c.lowat > 0 && err == syscall.EAGAIN {
			// a CoalesceTick with nothing: the stream paused or ended;
			// the next message raises the lowat again
			c.setLowat(0)
			c.lookIn = 0
		}
		if got > n-done {
			c.aheadOff, c.aheadLen = n-done, got-(n-done)
			got = n - done
		}
		if got > 0 {
			done += got
		}
		if stop, err := c.afterIO("read", got, err, done < n, false, start); stop {
			return done, err
		}
	}
	return done, nil
}

// ErrInterrupted marks an operation stopped by Interrupt.
var ErrInterrupted = errors.New("interrupted")

// ErrDeadline marks an operation still blocked when its timed transaction
// ended (SetUntil): the bytes it moved count, the message does not.
var ErrDeadline = errors.New("the timed transaction ended during the operation")

// SetUntil bounds every operation on c by t, the end of the timed
// transaction (zero: no bound). Without it a write that waits for room in a
// send buffer, behind a retransmission timeout, would hold the transaction
// open for as long as the network takes to recover.
func (c *Conn) SetUntil(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.until = t
	if c.fd < 0 && !c.interrupted {
		_ = c.nc.SetDeadline(t)
	}
}

// Retransmits returns the segments TCP retransmitted on c since the last
// call (TCP_INFO's total_retrans); 0 for UDP or when the kernel does not say.
func (c *Conn) Retransmits() int64 {
	if c.udp {
		return 0
	}
	var total uint32
	var ok bool
	read := func(fd uintptr) {
		var info syscall.TCPInfo
		size := uint32(syscall.SizeofTCPInfo)
		_, _, e := syscall.Syscall6(syscall.SYS_GETSOCKOPT, fd, syscall.IPPROTO_TCP, syscall.TCP_INFO,
			uintptr(unsafe.Pointer(&info)), uintptr(unsafe.Pointer(&size)), 0)
		if e == 0 && size >= uint32(unsafe.Offsetof(info.Total_retrans)+4) {
			total, ok = info.Total_retrans, true
		}
	}
	if c.fd >= 0 {
		if !c.acquireFD() {
			return 0
		}
		read(uintptr(c.fd))
		c.releaseFD()
	} else if sc, isSC := c.nc.(syscall.Conn); isSC {
		if rc, err := sc.SyscallConn(); err == nil {
			_ = rc.Control(read)
		}
	}
	if !ok || total < c.lastRetrans {
		return 0
	}
	d := total - c.lastRetrans
	c.lastRetrans = total
	return int64(d)
}

// Interrupt unblocks any pending or future I/O on c until Resume.
func (c *Conn) Interrupt() {
	c.mu.Lock()
	c.interrupted = true
	c.intr.Store(true)
	c.mu.Unlock()
	if c.fd < 0 {
		_ = c.nc.SetDeadline(time.Unix(1, 0))
	}
}

// Resume clears an Interrupt.
func (c *Conn) Resume() {
	c.mu.Lock()
	c.interrupted = false
	c.intr.Store(false)
	if c.fd < 0 {
		_ = c.nc.SetDeadline(c.until)
	}
	c.mu.Unlock()
}

func (c *Conn) isInterrupted() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.interrupted
}

// armTimeout sets the per-operation deadline, without undoing an interrupt.
func (c *Conn) armTimeout() {
	if c.timeout <= 0 {
		return
	}
	d := time.Now().Add(c.timeout)
	if !c.until.IsZero() && c.until.Before(d) {
		d = c.until
	}
	_ = c.nc.SetDeadline(d)
	if c.isInterrupted() {
		_ = c.nc.SetDeadline(time.Unix(1, 0))
	}
}

// classify turns a deadline error into ErrInterrupted or a timeout error.
func (c *Conn) classify(op string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		if c.isInterrupted() {
			return ErrInterrupted
		}
		if !c.until.IsZero() && !time.Now().Before(c.until) {
			return ErrDeadline
		}
		return fmt.Errorf("%s: timed out after %v", op, c.timeout)
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%s: peer closed the connection", op)
	}
	return fmt.Errorf("%s: %w", op, err)
}

// Read reads one message of len(buf) bytes: for TCP until the buffer is
// full, for UDP one datagram. It returns the bytes received even when it
// fails part way.
func (c *Conn) Read(buf []byte) (int, error) {
	if c.fd >= 0 {
		return c.blockingIO("read", buf, false)
	}
	c.armTimeout()
	if c.udp {
		n, err := c.nc.Read(buf)
		return n, c.classify("read", err)
	}
	got := 0
	for got < len(buf) {
		n, err := c.nc.Read(buf[got:])
		got += n
		if err != nil {
			if err == io.EOF && got == 0 {
				err = io.EOF
			}
			return got, c.classify("read", err)
		}
	}
	return got, nil
}

// Write sends one message (TCP: all of buf; UDP: one datagram).
func (c *Conn) Write(buf []byte) (int, error) {
	if c.fd >= 0 {
		return c.blockingIO("write", buf, true)
	}
	c.armTimeout()
	n, err := c.nc.Write(buf)
	return n, c.classify("write", err)
}

// Close closes the connection.
func (c *Conn) Close() error {
	if c.fd < 0 {
		return c.nc.Close()
	}
	for {
		st := c.fdState.Load()
		if st&fdClosed != 0 {
			return net.ErrClosed
		}
		if c.fdState.CompareAndSwap(st, st|fdClosed) {
			if st == 0 {
				return syscall.Close(c.fd)
			}
			return nil // the operation in progress closes it (releaseFD)
		}
	}
}

// sockopts returns a Control function applying wndsz before connect/listen.
func sockopts(wndsz int) func(network, address string, rc syscall.RawConn) error {
	if wndsz <= 0 {
		return nil
	}
	return func(network, address string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			if e := syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF, wndsz); e != nil {
				serr = fmt.Errorf("SO_SNDBUF %d: %w", wndsz, e)
				return
			}
			if e := syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, wndsz); e != nil {
				serr = fmt.Errorf("SO_RCVBUF %d: %w", wndsz, e)
			}
		})
		if err != nil {
			return err
		}
		return serr
	}
}

// applyTCP sets TCP_NODELAY the way uperf does: on only when asked (Go
// turns it on by default, so it is switched off otherwise).
func applyTCP(nc net.Conn, o Options) error {
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		return nil
	}
	if err := tc.SetNoDelay(o.NoDelay); err != nil {
		return fmt.Errorf("TCP_NODELAY: %w", err)
	}
	if o.WndSz > 0 {
		_ = tc.SetReadBuffer(o.WndSz)
		_ = tc.SetWriteBuffer(o.WndSz)
	}
	if o.CC != "" {
		// uperf warns and goes on; a measurement that silently ran another
		// congestion control than the profile asks for would be wrong, so
		// netload fails the connection with the reason instead
		raw, err := tc.SyscallConn()
		if err != nil {
			return fmt.Errorf("TCP_CONGESTION %s: %w", o.CC, err)
		}
		var serr error
		if err := raw.Control(func(fd uintptr) {
			serr = syscall.SetsockoptString(int(fd), syscall.IPPROTO_TCP, syscall.TCP_CONGESTION, o.CC)
		}); err != nil {
			return fmt.Errorf("TCP_CONGESTION %s: %w", o.CC, err)
		}
		if serr != nil {
			return fmt.Errorf("congestion control %q cannot be set (%v); this kernel offers: %s", o.CC, serr, availableCC())
		}
	}
	return nil
}

// availableCC lists the congestion controls this kernel has loaded.
func availableCC() string {
	b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_available_congestion_control")
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}

// DefaultConnectTimeout bounds a connect when the flowop gives no timeout.
const DefaultConnectTimeout = 10 * time.Second

// Dial opens a data connection to addr and introduces it with h.
func Dial(ctx context.Context, addr string, h Header, o Options) (*Conn, error) {
	timeout := o.Timeout
	if timeout <= 0 {
		timeout = DefaultConnectTimeout
	}
	d := net.Dialer{Timeout: timeout, Control: sockopts(o.WndSz)}
	if o.Protocol == "udp" {
		return dialUDP(ctx, d, addr, h, o)
	}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", addr, Explain(err))
	}
	if err := applyTCP(nc, o); err != nil {
		nc.Close()
		return nil, err
	}
	_ = nc.SetWriteDeadline(time.Now().Add(timeout))
	if _, err := nc.Write(h.Encode()); err != nil {
		nc.Close()
		return nil, fmt.Errorf("connect %s: sending hello: %w", addr, Explain(err))
	}
	_ = nc.SetWriteDeadline(time.Time{})
	return NewConn(nc, o), nil
}

// Explain adds a hint to errors a user can act on.
func Explain(err error) error {
	switch {
	case errors.Is(err, syscall.EMFILE), errors.Is(err, syscall.ENFILE):
		return fmt.Errorf("%w (out of file descriptors: raise the limit with ulimit -n, now %s)", err, FDLimitString())
	case errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Errorf("%w (nothing listens there: is `netload serve` running?)", err)
	case errors.Is(err, syscall.ENETUNREACH), errors.Is(err, syscall.EHOSTUNREACH):
		return fmt.Errorf("%w (no route to that address)", err)
	}
	return err
}

// FDLimit returns the soft and hard RLIMIT_NOFILE.
func FDLimit() (soft, hard uint64, err error) {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 0, 0, err
	}
	return r.Cur, r.Max, nil
}

// FDLimitString describes the current limit for messages.
func FDLimitString() string {
	s, h, err := FDLimit()
	if err != nil {
		return "unknown"
	}
	return fmt.Sprintf("soft %d, hard %d", s, h)
}

// OpenFDs counts this process's open file descriptors (-1 if unknown).
func OpenFDs() int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	return len(ents)
}

// CheckFDs returns an error when opening need more descriptors would
// exceed the soft limit (with a small margin for the runtime).
func CheckFDs(need int, who string) error {
	soft, _, err := FDLimit()
	if err != nil {
		return nil
	}
	open := OpenFDs()
	if open < 0 {
		open = 16
	}
	const margin = 16
	if uint64(open+need+margin) > soft {
		return fmt.Errorf("%s needs about %d more file descriptors (%d open now), but RLIMIT_NOFILE allows %d: raise it with `ulimit -n %d` (or more) before starting netload",
			who, need, open, soft, open+need+margin)
	}
	return nil
}
