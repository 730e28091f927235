package engine

import (
	"container/list"
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"runtime/debug"
	"sync"
	"time"

	"kvmtune/netload/internal/dataconn"
	"kvmtune/netload/internal/profile"
	"kvmtune/netload/internal/sysstat"
	"kvmtune/netload/internal/wire"
)

// Server is `netload serve`: it accepts control connections and runs the
// opposite side of each client's profile.
type Server struct {
	PeerTimeout time.Duration        // silence after which the client is dead (default 10s)
	StepGrace   time.Duration        // how long stragglers may take to reach the client's count (default 10s)
	Logf        func(string, ...any) // nil = quiet
	Once        bool                 // return after the first session

	// Token, when set, must come in the client's hello; a client without it
	// gets a one-line refusal before anything else happens.
	Token string
	// MaxSessions bounds the runs served at once (default 8); more are refused.
	MaxSessions int
	// MaxPending bounds the connections that have not yet sent a valid hello
	// (default 256). When it is reached the oldest one is closed, so idle or
	// slow connections cannot lock a legitimate client out.
	MaxPending int
	// MaxProfileBytes bounds a hello, which carries the profile (default 1 MiB).
	MaxProfileBytes int
	// HelloTimeout is the time a new connection has to send its whole hello
	// (default 5s): a slow sender is cut off then, however it trickles.
	HelloTimeout time.Duration
	// MaxRunMemory bounds what one run may make the server hold (see
	// runMemory: its strands' message buffers plus StrandCost per strand;
	// default DefaultMaxRunMemory). A larger run is refused at its hello.
	MaxRunMemory int64
	// MaxMemory bounds the same over every run served at once (default
	// DefaultMaxMemory); a run that would pass it is refused as busy.
	MaxMemory int64

	ln       net.Listener
	mu       sync.Mutex
	sessions map[*session]bool
	pending  *list.List // of *session, oldest first
	running  int        // sessions past the hello
	reserved int64      // runMemory of the sessions past the hello
	wg       sync.WaitGroup
}

// Listen opens the control listener.
func Listen(addr string) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, dataconn.Explain(err))
	}
	return &Server{ln: ln, sessions: map[*session]bool{}, pending: list.New()}, nil
}

// Addr is the control listener's address.
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

func (s *Server) logf(format string, a ...any) {
	if s.Logf != nil {
		s.Logf(format, a...)
	}
}

// Serve accepts clients until ctx ends (or after one session with Once).
func (s *Server) Serve(ctx context.Context) error {
	if s.PeerTimeout <= 0 {
		s.PeerTimeout = 10 * time.Second
	}
	if s.StepGrace <= 0 {
		s.StepGrace = 10 * time.Second
	}
	if s.MaxSessions <= 0 {
		s.MaxSessions = 8
	}
	if s.MaxPending <= 0 {
		s.MaxPending = 256
	}
	if s.MaxProfileBytes <= 0 {
		s.MaxProfileBytes = 1 << 20
	}
	if s.HelloTimeout <= 0 {
		s.HelloTimeout = 5 * time.Second
	}
	if s.MaxRunMemory <= 0 {
		s.MaxRunMemory = DefaultMaxRunMemory
	}
	if s.MaxMemory <= 0 {
		s.MaxMemory = DefaultMaxMemory
	}
	go func() {
		<-ctx.Done()
		s.ln.Close()
	}()
	defer s.shutdown()
	for {
		nc, err := s.ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			s.logf("accept: %v", dataconn.Explain(err))
			time.Sleep(50 * time.Millisecond)
			continue
		}
		ss := &session{srv: s, wc: wire.NewConn(nc)}
		ss.wc.MaxLine = s.MaxProfileBytes
		s.mu.Lock()
		s.sessions[ss] = true
		ss.pendingAt = s.pending.PushBack(ss)
		if s.pending.Len() > s.MaxPending {
			oldest := s.pending.Remove(s.pending.Front()).(*session)
			oldest.pendingAt = nil
			oldest.wc.Close()
		}
		s.mu.Unlock()
		s.wg.Add(1)
		run := func() {
			defer s.wg.Done()
			ss.run()
			s.mu.Lock()
			delete(s.sessions, ss)
			if ss.pendingAt != nil {
				s.pending.Remove(ss.pendingAt)
				ss.pendingAt = nil
			}
			s.mu.Unlock()
			ss.giveBack()
			ss.release()
		}
		if s.Once {
			// serve clients one at a time until one really ran (a port
			// probe or a refused hello does not count)
			run()
			if ss.started {
				s.ln.Close()
				return ss.err
			}
			continue
		}
		go run()
	}
}

// Close stops the server and every session.
func (s *Server) Close() {
	s.ln.Close()
	s.shutdown()
}

func (s *Server) shutdown() {
	s.mu.Lock()
	for ss := range s.sessions {
		ss.wc.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// session is one client's run on the server.
type session struct {
	srv       *Server
	wc        *wire.Conn
	pendingAt *list.Element // in srv.pending until the hello is read
	counted   bool          // holds one of srv.MaxSessions
	mem       int64         // the share of srv.MaxMemory it holds
	sd        *side
	err       error
	started   bool // the hello was accepted
}

// releaseSlot gives back the session's MaxSessions slot (once).
func (ss *session) releaseSlot() {
	ss.srv.mu.Lock()
	if ss.counted {
		ss.srv.running--
		ss.counted = false
	}
	ss.srv.mu.Unlock()
}

// release, at the end of the session, gives back its slot and its share of
// MaxMemory (after giveBack: the buffers are gone by then).
func (ss *session) release() {
	ss.releaseSlot()
	ss.srv.mu.Lock()
	ss.srv.reserved -= ss.mem
	ss.mem = 0
	ss.srv.mu.Unlock()
}

// giveBackAt is the run memory from which a session's end returns the
// freed heap to the system at once (debug.FreeOSMemory, which also runs a
// garbage collection). Below it (every built-in workload up to 250 users
// is) the runtime's own collection and scavenger are left to do it, so
// that a small run's end does not stall the runs still being measured.
const giveBackAt = 16 << 20

// giveBack drops what the ended session held; when its strands made large
// buffers, the memory goes back to the system now, not minutes later when
// the runtime gets to it (an idle server allocates nothing, so nothing
// would start a collection).
func (ss *session) giveBack() {
	allocated := ss.sd != nil && ss.sd.allocated
	ss.sd = nil
	if allocated && ss.mem >= giveBackAt {
		debug.FreeOSMemory()
	}
}

func (ss *session) refuse(format string, a ...any) {
	msg := fmt.Sprintf(format, a...)
	ss.err = errors.New(msg)
	ss.srv.logf("%s: refused: %s", ss.wc.Net().RemoteAddr(), msg)
	_ = ss.wc.Send(&wire.Msg{Type: wire.TError, Error: msg, ErrorClass: ClassSetup})
}

// checkProfile re-validates what a client sent (it did not come from our
// parser, so limits are checked again).
func checkProfile(p *profile.Profile) error {
	if p == nil || len(p.Groups) == 0 {
		return errors.New("the profile is empty")
	}
	total := 0
	for _, g := range p.Groups {
		if g.Strands < 1 || len(g.Transactions) == 0 {
			return fmt.Errorf("group %q is empty", g.Name)
		}
		total += g.Strands
		for _, t := range g.Transactions {
			if len(t.Flowops) == 0 || t.Iterations < 0 || t.Duration < 0 || (t.Iterations == 0 && t.Duration == 0) {
				return fmt.Errorf("group %q has a malformed transaction", g.Name)
			}
			for _, f := range t.Flowops {
				if f.Size < 0 || f.Size > profile.MaxSize || f.LastSize < 0 || f.LastSize > f.Size || f.RSize < 0 || f.RSize > profile.MaxSize || f.Count < 1 || f.Count > profile.MaxCount {
					return fmt.Errorf("group %q has a flowop out of range", g.Name)
				}
				if f.Type.Moves() && f.Size < 1 {
					return fmt.Errorf("group %q has a %s without size", g.Name, f.Type)
				}
				if !f.Type.Known() {
					return fmt.Errorf("unknown flowop %q", f.Type)
				}
				if f.Port < 0 || f.Port > 65535 || f.Conn < -1 || f.Conn > profile.MaxConnID || f.Duration < 0 || f.Timeout < 0 {
					return fmt.Errorf("group %q has a flowop out of range", g.Name)
				}
				if f.Type.Opens() && f.Protocol != "tcp" && f.Protocol != "udp" {
					return fmt.Errorf("group %q: protocol %q (tcp or udp)", g.Name, f.Protocol)
				}
			}
		}
	}
	if total > profile.MaxStrands {
		return fmt.Errorf("%d strands is more than %d", total, profile.MaxStrands)
	}
	return nil
}

// What a client may make a server hold. A real profile needs far less: the
// largest of netload's and kvmtune's (profiles/, bench/net's catalogue, at
// most 1,000 users) is 1,000 strands of 64 KiB, 96 MiB with StrandCost;
// seed 002's largest (250 users of 30 KiB) is 15 MiB. Probe guests have
// 512 MiB by default.
const (
	DefaultMaxRunMemory int64 = 256 << 20 // one run
	DefaultMaxMemory    int64 = 512 << 20 // every run served at once
	// StrandCost is what a strand holds besides its message buffer: its
	// goroutine's stack, its statistics and histogram pages, its
	// connections' state. A server's peak RSS grew by 20 KiB per strand
	// for rr1c-1x1 with 1,000 users (27 KiB with 250), the collector's
	// headroom included.
	StrandCost int64 = 32 << 10
)

// runMemory is what profile p may make a side hold: one buffer of the
// largest message per strand (a server's strand uses the size or the rsize
// of the client's flowops) and StrandCost per strand.
func runMemory(p *profile.Profile) int64 {
	return bufferBytes(p) + int64(p.Strands())*StrandCost
}

func bufferBytes(p *profile.Profile) int64 {
	var total int64
	for _, g := range p.Groups {
		var largest int64
		for _, t := range g.Transactions {
			for _, f := range t.Flowops {
				largest = max(largest, f.Size, f.RSize)
			}
		}
		total += largest * int64(g.Strands)
	}
	return total
}

// reserve takes need bytes of the server's MaxMemory for the session, or
// refuses the run (a clear error to the client, a line in the log).
func (ss *session) reserve(need int64, strands int) bool {
	srv := ss.srv
	if need > srv.MaxRunMemory {
		ss.refuse("the run would hold %s on this server (the message buffers of its %d strands and %s per strand), more than its limit of %s per run (serve --max-run-memory)",
			mib(need), strands, kib(StrandCost), mib(srv.MaxRunMemory))
		return false
	}
	srv.mu.Lock()
	held := srv.reserved
	ok := held+need <= srv.MaxMemory
	if ok {
		srv.reserved += need
		ss.mem = need
	}
	srv.mu.Unlock()
	if !ok {
		ss.refuse("busy: the run would hold %s on this server, and the runs it serves hold %s of its %s (serve --max-memory)",
			mib(need), mib(held), mib(srv.MaxMemory))
	}
	return ok
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
func kib(n int64) string { return fmt.Sprintf("%d KiB", n>>10) }

func (ss *session) run() {
	defer ss.wc.Close()
	peer := ss.wc.Net().RemoteAddr()
	m, err := ss.wc.Recv(ss.srv.HelloTimeout)
	if err != nil {
		ss.err = fmt.Errorf("no hello from %v: %w", peer, err)
		if errors.Is(err, wire.ErrTooLong) {
			ss.refuse("the hello is larger than this server's limit of %d bytes (serve --max-profile-bytes)", ss.srv.MaxProfileBytes)
			return
		}
		ss.srv.logf("%v: %v", peer, ss.err)
		return
	}
	if m.Type != wire.THello || m.Magic != wire.Magic {
		ss.refuse("expected a netload hello, got %q", m.Type)
		return
	}
	if ss.srv.Token != "" && subtle.ConstantTimeCompare([]byte(m.Token), []byte(ss.srv.Token)) != 1 {
		if m.Token == "" {
			ss.refuse("this server needs a token (run --token or $NETLOAD_TOKEN)")
		} else {
			ss.refuse("wrong token")
		}
		return
	}
	ss.srv.mu.Lock()
	if ss.pendingAt != nil {
		ss.srv.pending.Remove(ss.pendingAt)
		ss.pendingAt = nil
	}
	busy := ss.srv.running >= ss.srv.MaxSessions
	if !busy {
		ss.srv.running++
		ss.counted = true
	}
	ss.srv.mu.Unlock()
	if busy {
		ss.refuse("busy: this server already serves %d runs (serve --max-sessions)", ss.srv.MaxSessions)
		return
	}
	if m.Version < wire.MinVersion || m.Version > wire.Version {
		ss.refuse("control protocol version %d, this server speaks %d to %d (use the same netload on both sides)", m.Version, wire.MinVersion, wire.Version)
		return
	}
	if err := checkProfile(m.Profile); err != nil {
		ss.refuse("bad profile: %v", err)
		return
	}
	if !ss.reserve(runMemory(m.Profile), m.Profile.Strands()) {
		return
	}
	sprof := m.Profile.Opposite()
	listeners := 2
	if err := dataconn.CheckFDs(needFDs(sprof)+listeners, fmt.Sprintf("the server (%d users)", sprof.Strands())); err != nil {
		ss.refuse("%v", err)
		return
	}
	local := ss.wc.Net().LocalAddr().(*net.TCPAddr).IP.String()
	remote := peer.(*net.TCPAddr).IP.String()
	// a multi-host run's profile marks the ops this server leaves out
	// (Elsewhere); strands, connections and flowop positions are the whole
	// profile's, so the client's pass counts (end's targets) apply as they are
	sd := newSide("server", sprof, m.RunID, nil)
	ss.sd = sd
	defer sd.close()
	if err := sd.setIO(m.IOMode); err != nil {
		ss.refuse("%v", err)
		return
	}
	if err := sd.setupListeners([]string{local}); err != nil {
		ss.refuse("%v", err)
		return
	}
	sd.setPeer(0, remote, m.TCPPort, m.UDPPorts)
	if err := ss.wc.Send(&wire.Msg{Type: wire.THelloOK, Version: wire.Version, TCPPort: sd.tcpPort(0), UDPPorts: sd.udpPorts(), Host: hostInfo()}); err != nil {
		ss.err = err
		return
	}
	ss.started = true
	ss.srv.logf("%v: running profile %q with %d users", peer, sprof.Name, sprof.Strands())

	link := startControlLink(ss.wc, ss.srv.PeerTimeout)
	defer link.close()
	msgs, readErr := link.msgs, link.readErr

	var rs *runningStep
	abortStep := func() {
		if rs == nil {
			return
		}
		sd.abort(rs)
		select {
		case <-rs.done:
		case <-time.After(5 * time.Second):
			ss.srv.logf("%v: strands did not stop within 5s of an abort", peer)
		}
		rs = nil
	}
	finished := false // the running step's strands are all done
	for {
		var done chan struct{}
		if rs != nil && !finished {
			done = rs.done
		}
		select {
		case m := <-msgs:
			switch m.Type {
			case wire.TBegin:
				if rs != nil {
					ss.refuse("protocol error: begin %d while step %d runs", m.Step, rs.k)
					abortStep()
					return
				}
				rs = sd.startStep(m.Step, false)
				finished = false
			case wire.TEnd:
				if rs == nil || rs.k != m.Step {
					ss.refuse("protocol error: end of step %d, which is not running", m.Step)
					abortStep()
					return
				}
				short, note := ss.endStep(rs, m.Targets, time.Duration(m.DrainMs)*time.Millisecond, readErr)
				if note == errPeerGone {
					abortStep()
					ss.err = errors.New("client went away")
					return
				}
				st, _ := sd.collect(rs)
				for i := range st.Txns {
					f := short[st.Txns[i].Group]
					st.Txns[i].CutStrands, st.Txns[i].ShortPasses = f.strands, f.passes
				}
				if note != nil {
					for i := range st.Txns {
						if st.Txns[i].FirstError == "" {
							st.Txns[i].FirstError = note.Error()
						}
						st.Txns[i].Errors++
					}
				}
				if err := ss.wc.Send(&wire.Msg{Type: wire.TEnded, Step: rs.k, Stats: st}); err != nil {
					abortStep()
					ss.err = err
					return
				}
				rs = nil
				sd.resumeAll()
			case wire.TAbort:
				abortStep()
				ss.srv.logf("%v: the client called the run off", peer)
				return
			case wire.TBye:
				abortStep()
				// the client takes this reply as the end of its run and may start the next at
				// once: its slot must be free by then, not after this session's teardown
				// (its share of MaxMemory stays taken until the buffers are given back)
				ss.releaseSlot()
				_ = ss.wc.Send(&wire.Msg{Type: wire.TBye, Stats: &wire.SideStats{PeakRSS: sysstat.PeakRSS()}})
				ss.srv.logf("%v: run finished", peer)
				return
			}
		case <-done:
			// strands of an iterations step finished before the client's end: wait for it
			finished = true
		case err := <-sd.failCh:
			_ = ss.wc.Send(&wire.Msg{Type: wire.TError, Error: err.Error(), ErrorClass: ClassRun})
		case err := <-sd.fatalCh:
			_ = ss.wc.Send(&wire.Msg{Type: wire.TError, Error: err.Error(), ErrorClass: ClassSetup})
			abortStep()
			ss.err = err
			ss.srv.logf("%v: %v", peer, err)
			return
		case err := <-readErr:
			abortStep()
			ss.err = fmt.Errorf("client %v lost: %w", peer, err)
			ss.srv.logf("%v", ss.err)
			return
		}
	}
}

var errPeerGone = errors.New("peer gone")

// shortfall is what a group's strands had not received of the client's
// count when the drain time was up.
type shortfall struct{ strands, passes int64 }

// endStep stops the step at the client's pass counts and waits for the
// strands. It returns a note when stragglers had to be cut off. With a
// drain time (the end of a timed step), strands whose connections are only
// closed afterwards wait that long for what is still in flight; what has
// not arrived by then is returned per group as a shortfall, not an error:
// TCP still owes it (a sender in retransmission backoff), nothing was lost,
// and a later step cannot be misaligned by it.
func (ss *session) endStep(rs *runningStep, targets []int64, drain time.Duration, readErr chan error) (map[int]shortfall, error) {
	sd := ss.sd
	sd.stop(rs, targets)
	grace := time.NewTimer(ss.srv.StepGrace)
	defer grace.Stop()
	var drained <-chan time.Time
	if drain > 0 && drain < ss.srv.StepGrace {
		t := time.NewTimer(drain)
		defer t.Stop()
		drained = t.C
	}
	// UDP readers may never reach the client's count: lost datagrams are not
	// sent again. Once only they are left, they are stopped after a short
	// wait and their shortfall is the loss the report shows, not an error.
	udpCheck := time.NewTicker(udpLossWait)
	defer udpCheck.Stop()
wait:
	for {
		select {
		case <-rs.done:
			return nil, nil
		case <-drained:
			drained = nil
			if sd.onlyFinalShort(rs) {
				sd.interruptAll()
				select {
				case <-rs.done:
				case <-time.After(5 * time.Second):
				}
				return sd.shortfalls(rs), nil
			}
		case <-grace.C:
			break wait
		case <-udpCheck.C:
			if sd.onlyUDPReadersShort(rs) {
				sd.interruptAll()
				select {
				case <-rs.done:
				case <-time.After(5 * time.Second):
				}
				return nil, nil
			}
		case err := <-readErr:
			readErr <- err
			return nil, errPeerGone
		}
	}
	short := 0
	for _, s := range sd.strands {
		if s.stepPasses.Load() < rs.ctl.targets[s.id] {
			short++
		}
	}
	sd.interruptAll()
	select {
	case <-rs.done:
	case <-time.After(5 * time.Second):
	}
	if short == 0 {
		return nil, fmt.Errorf("server strands did not stop within %v after the client stopped", ss.srv.StepGrace)
	}
	return nil, fmt.Errorf("%d server strands had not reached the client's transaction count %v after the client stopped", short, ss.srv.StepGrace)
}

// onlyFinalShort reports whether some strand is short of the client's count
// in step rs and every such strand runs a final transaction there (its
// connections carry no data after this step).
func (sd *side) onlyFinalShort(rs *runningStep) bool {
	short := false
	for _, s := range sd.strands {
		if s.stepPasses.Load() >= rs.ctl.targets[s.id] {
			continue
		}
		short = true
		if rs.k >= len(s.txns) || !s.txns[rs.k].final {
			return false
		}
	}
	return short
}

// shortfalls counts, per group, the strands short of the client's count in
// step rs and the passes they miss.
func (sd *side) shortfalls(rs *runningStep) map[int]shortfall {
	out := map[int]shortfall{}
	for _, s := range sd.strands {
		if miss := rs.ctl.targets[s.id] - s.stepPasses.Load(); miss > 0 {
			f := out[s.group]
			f.strands++
			f.passes += miss
			out[s.group] = f
		}
	}
	return out
}

// udpLossWait is how long the server waits for UDP readers that are short of
// the client's count before it takes the missing datagrams as lost.
const udpLossWait = time.Second

// onlyUDPReadersShort reports whether every strand still short of the
// client's count in step rs reads from a UDP connection in that step.
func (sd *side) onlyUDPReadersShort(rs *runningStep) bool {
	short := false
	for _, s := range sd.strands {
		if s.stepPasses.Load() >= rs.ctl.targets[s.id] {
			continue
		}
		short = true
		if rs.k >= len(s.txns) || !s.txns[rs.k].readsUDP() {
			return false
		}
	}
	return short
}
