package engine

import (
	"errors"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"kvmtune/netload/internal/dataconn"
	"kvmtune/netload/internal/histogram"
	"kvmtune/netload/internal/profile"
	"kvmtune/netload/internal/wire"
)

// yieldEvery is how often a strand lets the Go scheduler run (see runStep).
const yieldEvery = 5 * time.Millisecond

// stepCtl is shared by the strands of one side during one step.
type stepCtl struct {
	deadlines []time.Time // per group; timed transactions on the controller stop there
	stop      atomic.Bool
	targets   []int64 // serving side: passes to complete before stopping
	aborted   atomic.Bool
}

// op is a flowop prepared for execution.
type op struct {
	last    int // size of the last of count executions (0 = size)
	typ     profile.Op
	exec    executor
	size    int
	count   int64
	ci      int // dense connection index in the strand
	fi      int // position in the transaction (its statistics slot)
	host    int // the peer its connection goes to (side.peers)
	connID  int
	port    int
	opts    dataconn.Options
	dur     time.Duration
	busy    bool
	canFail bool
	timeout time.Duration
}

// ptxn is a transaction prepared for execution: the ops this side runs,
// which on a server of a multi-host run leave out the ops marked Elsewhere.
type ptxn struct {
	t   *profile.Transaction
	ops []op
	// final: no later transaction of the group reads or writes on the
	// connections this one uses (at most closes them), so a message cut
	// short when a timed transaction ends cannot misalign a later step.
	final bool
	// moves: some op reads or writes messages (the strand's buffer is needed)
	moves bool
}

// idle reports whether none of the transaction's flowops runs here (a
// server of a multi-host run whose host this transaction does not touch):
// the strand sits the step out instead of counting empty passes.
func (pt *ptxn) idle() bool { return len(pt.ops) == 0 }

// strand is one user: it runs its group's transactions in order.
type strand struct {
	id    int // global index across groups, identical on both sides
	group int
	sd    *side
	txns  []ptxn
	// buf holds one message of the largest size (bufSize); it is made by the
	// first step that moves data (side.startStep), not when the run is set
	// up, so a hello commits no memory, and it goes with the strand.
	buf     []byte
	bufSize int
	conns   []*dataconn.Conn

	lastPiece bool // the flowop being run is at its last count (op.last applies)

	mu          sync.Mutex
	interrupted bool
	cancel      chan struct{}

	// live counters, read by the interval sampler
	bytes  atomic.Int64
	ops    atomic.Int64
	passes atomic.Int64
	// passes done in the current step (read by the waker)
	stepPasses atomic.Int64

	res stepResult
}

type stepResult struct {
	ran          bool
	bytesRead    int64
	bytesWritten int64
	ops          int64
	passes       int64
	errors       int64
	retransmits  int64 // TCP segments sent again on the strand's connections (TCP_INFO)
	cut          bool  // an operation in progress was cut at the timed transaction's end
	firstErr     error
	flow         []wire.FlowopStats
	hist         histogram.Histogram
	end          time.Time
}

func newStrand(sd *side, id, group int, g *profile.Group) *strand {
	s := &strand{id: id, group: group, sd: sd, cancel: make(chan struct{})}
	dense := map[int]int{}
	maxBuf := 0
	for ti := range g.Transactions {
		t := &g.Transactions[ti]
		pt := ptxn{t: t}
		for fi, f := range t.Flowops {
			if f.Elsewhere {
				continue
			}
			ci, ok := dense[f.Conn]
			if !ok {
				ci = len(dense)
				dense[f.Conn] = ci
			}
			o := op{typ: f.Type, size: int(f.Size), count: f.Count, ci: ci, fi: fi, host: sd.hostOf(&f), connID: f.Conn, port: f.Port,
				opts: dataconn.Options{Protocol: f.Protocol, NoDelay: f.NoDelay, WndSz: int(f.WndSz), CC: f.CC, Timeout: f.Timeout},
				dur:  f.Duration, busy: f.Busy, canFail: f.CanFail, timeout: f.Timeout}
			o.exec = executors[f.Type]
			o.last = int(f.LastSize)
			if o.count < 1 {
				o.count = 1
			}
			if o.size > maxBuf {
				maxBuf = o.size
			}
			if f.Type.Moves() {
				pt.moves = true
			}
			pt.ops = append(pt.ops, o)
		}
		s.txns = append(s.txns, pt)
	}
	for ti := range s.txns {
		s.txns[ti].final = finalTxn(s.txns, ti)
	}
	s.conns = make([]*dataconn.Conn, len(dense))
	s.bufSize = maxBuf
	return s
}

// makeBuf makes the strand's message buffer before step k if that step
// moves data and the buffer is not there yet; it reports whether it did.
func (s *strand) makeBuf(k int) bool {
	if s.buf != nil || k >= len(s.txns) || !s.txns[k].moves {
		return false
	}
	s.buf = make([]byte, s.bufSize)
	for i := range s.buf {
		s.buf[i] = byte('a' + i%26)
	}
	return true
}

// interrupt unblocks whatever the strand is waiting for.
func (s *strand) interrupt() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.interrupted {
		return
	}
	s.interrupted = true
	close(s.cancel)
	for _, c := range s.conns {
		if c != nil {
			c.Interrupt()
		}
	}
}

// resume clears an interrupt between steps.
func (s *strand) resume() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.interrupted {
		return
	}
	s.interrupted = false
	s.cancel = make(chan struct{})
	for _, c := range s.conns {
		if c != nil {
			c.Resume()
		}
	}
}

func (s *strand) cancelCh() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cancel
}

func (s *strand) setConn(ci int, c *dataconn.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.conns[ci] = c
	if c != nil && s.interrupted {
		c.Interrupt()
	}
}

// closeAll closes every connection (end of run or abort).
func (s *strand) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, c := range s.conns {
		if c != nil {
			c.Close()
			s.conns[i] = nil
		}
	}
}

// runStep runs transaction k of the strand's group, if it has one.
func (s *strand) runStep(k int, ctl *stepCtl) {
	r := &s.res
	*r = stepResult{hist: r.hist}
	r.hist.Reset()
	s.stepPasses.Store(0)
	if k >= len(s.txns) || s.txns[k].idle() {
		r.end = time.Now()
		return
	}
	r.ran = true
	pt := &s.txns[k]
	t := pt.t
	// one slot per flowop of the transaction, also those another host runs,
	// so that every host's statistics merge slot by slot
	r.flow = make([]wire.FlowopStats, len(t.Flowops))
	for i := range t.Flowops {
		r.flow[i].Type = string(t.Flowops[i].Type)
	}
	var pace time.Duration
	if t.Rate > 0 {
		pace = time.Duration(float64(time.Second) / t.Rate)
	}
	var deadline time.Time
	if s.group < len(ctl.deadlines) {
		deadline = ctl.deadlines[s.group]
	}
	hasDeadline := !deadline.IsZero() && t.Timed()
	if hasDeadline && pt.final {
		s.bound(deadline)
		defer s.bound(time.Time{})
	}
	defer s.countRetransmits(r)
	if c := s.streamConn(pt, pace); c != nil {
		c.SetStreaming(true)
		defer c.SetStreaming(false)
	}
	start := time.Now()
	next := start
	yielded := start
	// The end of one pass is the start of the next: one clock read per
	// pass, not two (a 30 KiB stream write takes about 10 us, of which a
	// clock read is about 1 %).
	now := start
	for pass := int64(0); ; pass++ {
		if t.Iterations > 0 && pass >= t.Iterations {
			break
		}
		if now.Sub(yielded) >= yieldEvery {
			// A goroutine that never passes through the scheduler looks
			// stuck to the runtime's monitor (sysmon): after 10 ms it takes
			// the P away from the next system call and then polls every
			// 20 us again, a wake-up per message on this CPU.
			runtime.Gosched()
			now = time.Now()
			yielded = now
		}
		if hasDeadline && !now.Before(deadline) {
			break
		}
		if ctl.stop.Load() && pass >= ctl.targets[s.id] {
			break
		}
		if ctl.aborted.Load() {
			break
		}
		if pace > 0 {
			if wait := next.Sub(now); wait > 0 {
				if hasDeadline && next.After(deadline) {
					break
				}
				if err := dataconn.Think(wait, false, s.cancelCh()); err != nil {
					break
				}
				now = time.Now()
			}
			next = next.Add(pace)
		}
		read0, written0 := r.bytesRead, r.bytesWritten
		end, err := s.pass(pt, r, now)
		if err != nil {
			if errors.Is(err, dataconn.ErrInterrupted) && (ctl.aborted.Load() || ctl.stop.Load()) {
				r.bytesRead, r.bytesWritten = read0, written0 // stopped by the controller: not an error, nor a pass
				break
			}
			if errors.Is(err, dataconn.ErrDeadline) {
				// the measured time is over: the pass in progress does not count, nor do its bytes,
				// so that bytes stay whole passes, as the server counts them
				r.bytesRead, r.bytesWritten = read0, written0
				r.cut = true
				break
			}
			r.errors++
			if r.firstErr == nil {
				r.firstErr = err
			}
			s.sd.strandFailed(s, err)
			break
		}
		r.hist.Record(uint64(end.Sub(now)))
		if len(pt.ops) > 0 {
			now = end
		} else {
			now = time.Now() // an empty pass reads no clock: the deadline must still come
		}
		r.passes++
		s.stepPasses.Store(r.passes)
		s.passes.Add(1)
	}
	r.end = time.Now()
}

// streamConn returns the connection a timed, unpaced transaction only
// reads from, message after message: the receiving side of a stream,
// whose reads may wait for several messages at a time
// (dataconn.Conn.SetStreaming, which leaves UDP alone). nil for any other
// transaction.
func (s *strand) streamConn(pt *ptxn, pace time.Duration) *dataconn.Conn {
	if !pt.t.Timed() || pace > 0 || len(pt.ops) == 0 {
		return nil
	}
	for _, o := range pt.ops {
		if o.typ != profile.OpRead || o.ci != pt.ops[0].ci {
			return nil
		}
	}
	return s.conns[pt.ops[0].ci]
}

// bound ends every operation on the strand's open connections at t (zero:
// no bound); see dataconn.Conn.SetUntil.
func (s *strand) bound(t time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		if c != nil {
			c.SetUntil(t)
		}
	}
}

// countRetransmits adds what TCP retransmitted on the strand's open
// connections since the last look.
func (s *strand) countRetransmits(r *stepResult) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		if c != nil {
			r.retransmits += c.Retransmits()
		}
	}
}

// finalTxn reports whether transaction ti of txns is the last to move data
// on each connection it uses.
func finalTxn(txns []ptxn, ti int) bool {
	used := map[int]bool{}
	for _, o := range txns[ti].ops {
		used[o.ci] = true
	}
	for _, later := range txns[ti+1:] {
		for _, o := range later.ops {
			if used[o.ci] && (o.typ == profile.OpRead || o.typ == profile.OpWrite) {
				return false
			}
		}
	}
	return true
}

// pass runs every flowop of the transaction once (each count times).
func (s *strand) pass(pt *ptxn, r *stepResult, t0 time.Time) (time.Time, error) {
	prev := t0
	for i := range pt.ops {
		o := &pt.ops[i]
		for c := int64(0); c < o.count; c++ {
			s.lastPiece = c == o.count-1
			err := o.exec(s, o, r)
			now := time.Now()
			if err != nil && (errors.Is(err, dataconn.ErrInterrupted) || errors.Is(err, dataconn.ErrDeadline)) {
				return now, err // stopped from outside or by the clock: not an operation
			}
			fs := &r.flow[o.fi]
			d := uint64(now.Sub(prev))
			if fs.Count == 0 || d < fs.MinNs {
				fs.MinNs = d
			}
			if d > fs.MaxNs {
				fs.MaxNs = d
			}
			fs.Count++
			fs.SumNs += float64(d)
			prev = now
			r.ops++
			s.ops.Add(1)
			if err != nil {
				if o.canFail && !errors.Is(err, dataconn.ErrInterrupted) {
					r.errors++
					if r.firstErr == nil {
						r.firstErr = err
					}
					continue
				}
				return now, err
			}
		}
	}
	return prev, nil
}

func (s *strand) connect(o *op, _ *stepResult) error {
	if old := s.conns[o.ci]; old != nil {
		s.setConn(o.ci, nil)
		old.Close()
	}
	p := &s.sd.peers[o.host]
	port := o.port
	if o.opts.Protocol == "udp" {
		if port == 0 {
			port = p.udp[dataconn.Key{Strand: uint32(s.id), Conn: uint32(o.connID)}]
		}
	} else if port == 0 {
		port = p.tcpPort
	}
	if port == 0 {
		return fmt.Errorf("connect: the peer announced no port for connection %d", o.connID)
	}
	addr := net.JoinHostPort(p.host, strconv.Itoa(port))
	h := dataconn.Header{RunID: s.sd.runID, Strand: uint32(s.id), Conn: uint32(o.connID)}
	c, err := dataconn.Dial(s.sd.ctx, addr, h, o.opts)
	if err != nil {
		if s.sd.ctx.Err() != nil {
			return dataconn.ErrInterrupted
		}
		return err
	}
	if s.sd.blocking {
		if err := c.SetBlocking(); err != nil {
			c.Close()
			return err
		}
	}
	s.setConn(o.ci, c)
	return nil
}

func (s *strand) accept(o *op, _ *stepResult) error {
	if old := s.conns[o.ci]; old != nil {
		s.setConn(o.ci, nil)
		old.Close()
	}
	key := dataconn.Key{Strand: uint32(s.id), Conn: uint32(o.connID)}
	var c *dataconn.Conn
	var err error
	if o.opts.Protocol == "udp" {
		ep := s.sd.udp[key]
		if ep == nil {
			return fmt.Errorf("accept: no UDP endpoint for connection %d", o.connID)
		}
		c, err = ep.Accept(dataconn.Header{RunID: s.sd.runID, Strand: key.Strand, Conn: key.Conn}, o.opts, s.cancelCh(), o.timeout)
	} else {
		a := s.sd.peers[o.host].acceptors[o.port]
		if a == nil {
			return fmt.Errorf("accept: no listener on port %d", o.port)
		}
		c, err = a.Accept(key, o.opts, s.cancelCh(), o.timeout)
	}
	if err != nil {
		return err
	}
	if s.sd.blocking {
		if err := c.SetBlocking(); err != nil {
			c.Close()
			return err
		}
	}
	s.setConn(o.ci, c)
	return nil
}

// executor runs one flowop once. Every entry of profile.Flowops has exactly
// one (checked in init), so the flowop table stays the only list of flowops.
type executor func(s *strand, o *op, r *stepResult) error

var executors = map[profile.Op]executor{
	profile.OpRead:       (*strand).read,
	profile.OpWrite:      (*strand).write,
	profile.OpConnect:    (*strand).connect,
	profile.OpAccept:     (*strand).accept,
	profile.OpDisconnect: (*strand).disconnect,
	profile.OpThink:      (*strand).think,
	profile.OpNop:        func(*strand, *op, *stepResult) error { return nil },
}

func init() {
	if err := checkExecutors(); err != nil {
		panic(err)
	}
}

// checkExecutors keeps executors and profile.Flowops in step.
func checkExecutors() error {
	if len(executors) != len(profile.Flowops) {
		return fmt.Errorf("netload: %d executors for %d flowops", len(executors), len(profile.Flowops))
	}
	for _, sp := range profile.Flowops {
		if executors[sp.Op] == nil {
			return fmt.Errorf("netload: flowop %s has no executor", sp.Op)
		}
	}
	return nil
}

func (s *strand) read(o *op, r *stepResult) error {
	conn := s.conns[o.ci]
	if conn == nil {
		return fmt.Errorf("read: connection %d is not open", o.connID)
	}
	n, err := conn.Discard(o.sizeNow(s.lastPiece), s.buf)
	r.bytesRead += int64(n)
	s.bytes.Add(int64(n))
	return err
}

func (s *strand) write(o *op, r *stepResult) error {
	conn := s.conns[o.ci]
	if conn == nil {
		return fmt.Errorf("write: connection %d is not open", o.connID)
	}
	n, err := conn.Write(s.buf[:o.sizeNow(s.lastPiece)])
	r.bytesWritten += int64(n)
	s.bytes.Add(int64(n))
	return err
}

func (s *strand) disconnect(o *op, r *stepResult) error {
	if conn := s.conns[o.ci]; conn != nil {
		r.retransmits += conn.Retransmits()
		s.setConn(o.ci, nil)
		conn.Close()
	}
	return nil
}

func (s *strand) think(o *op, _ *stepResult) error {
	return dataconn.Think(o.dur, o.busy, s.cancelCh())
}

func (o *op) sizeNow(last bool) int {
	if last && o.last > 0 {
		return o.last
	}
	return o.size
}

// readsUDP reports whether this side reads from a UDP connection in the transaction.
func (pt *ptxn) readsUDP() bool {
	for i := range pt.ops {
		if pt.ops[i].typ == profile.OpRead && pt.ops[i].opts.Protocol == "udp" {
			return true
		}
	}
	return false
}
