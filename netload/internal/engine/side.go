// Package engine runs a profile: the controller side ("run") and the
// serving side ("serve") each run every strand of every group as a
// goroutine; transaction steps are started and stopped together over the
// control connection (package wire), like uperf's per-transaction barrier.
package engine

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"sort"
	"sync"
	"time"

	"kvmtune/netload/internal/dataconn"
	"kvmtune/netload/internal/histogram"
	"kvmtune/netload/internal/profile"
	"kvmtune/netload/internal/sysstat"
	"kvmtune/netload/internal/wire"
)

// side is one end of a run: its strands, listeners and peer addresses.
type side struct {
	role    string // "client" or "server"
	prof    *profile.Profile
	runID   uint32
	strands []*strand

	// peers are the other ends: one server for a server's side and for a
	// single-host run, one per remote host for a multi-host run (indexed as
	// the hosts of RunConfig.Remotes; an op's host picks its peer).
	peers     []peer
	hostIndex map[string]int // remotehost -> index in peers (client side)
	listeners []*dataconn.Acceptor
	udp       map[dataconn.Key]*dataconn.UDPEndpoint

	ctx    context.Context
	cancel context.CancelFunc

	blocking  bool // TCP data connections use blocking I/O (dataconn.Conn)
	allocated bool // a strand made its message buffer (strand.makeBuf)
	procsSet  bool // the strands count in GOMAXPROCS (setIO)
	closeOnce sync.Once

	// failures reported by strands and acceptors
	failMu  sync.Mutex
	failed  error
	failCh  chan error // first strand failure of a step (buffered 1)
	fatalCh chan error // acceptor failures (buffered 1)
}

// peer is one other end of the run and what this side knows of it.
type peer struct {
	host    string               // its address, for data connections
	tcpPort int                  // its default data listener
	udp     map[dataconn.Key]int // its UDP endpoints
	// local is this side's address toward it; the acceptors listen there
	// (by port; 0 = the default listener).
	local     string
	acceptors map[int]*dataconn.Acceptor
}

// newSide makes a side for profile p. hosts names the remote hosts of a
// multi-host run, in the order of the peers (nil: one peer, which every op
// uses).
func newSide(role string, p *profile.Profile, runID uint32, hosts []string) *side {
	ctx, cancel := context.WithCancel(context.Background())
	sd := &side{role: role, prof: p, runID: runID, udp: map[dataconn.Key]*dataconn.UDPEndpoint{},
		ctx: ctx, cancel: cancel, failCh: make(chan error, 1), fatalCh: make(chan error, 1)}
	n := max(len(hosts), 1)
	sd.peers = make([]peer, n)
	for i := range sd.peers {
		sd.peers[i] = peer{udp: map[dataconn.Key]int{}, acceptors: map[int]*dataconn.Acceptor{}}
	}
	if len(hosts) > 1 {
		sd.hostIndex = map[string]int{}
		for i, h := range hosts {
			sd.hostIndex[h] = i
		}
	}
	id := 0
	for gi := range p.Groups {
		g := &p.Groups[gi]
		for i := 0; i < g.Strands; i++ {
			sd.strands = append(sd.strands, newStrand(sd, id, gi, g))
			id++
		}
	}
	return sd
}

// IO modes (RunConfig.IOMode, `--io`).
const (
	IOAuto     = "auto"
	IOBlocking = "blocking"
	IOPoll     = "poll"
)

// AutoBlockingMax is the most strands per CPU for which "auto" picks
// blocking I/O; above it, Go's poller scales better.
const AutoBlockingMax = 2

// chooseIO resolves an I/O mode for a side running n strands.
func chooseIO(mode string, n int) (bool, error) {
	switch mode {
	case "", IOAuto:
		return n <= AutoBlockingMax*runtime.NumCPU(), nil
	case IOBlocking:
		return true, nil
	case IOPoll:
		return false, nil
	}
	return false, fmt.Errorf("unknown I/O mode %q (auto, blocking or poll)", mode)
}

// procs tracks the strands of every active side in this process, so
// GOMAXPROCS can follow them (an explicit GOMAXPROCS in the environment is
// left alone):
//   - poll mode: one P per strand, never above the CPU count; with fewer
//     strands than CPUs, extra Ps only add scheduler wake-ups to every
//     message (measured: 1 strand runs request/response 20-40 % faster
//     with GOMAXPROCS=1 than with 2 on 2 CPUs).
//   - blocking mode: one P per strand plus one spare, even above the CPU
//     count. A strand sleeping in read(2) keeps its P; with no idle P left,
//     the runtime's monitor (sysmon) takes it away from every read that
//     spans two of its ticks and hands it to another thread, and goes on
//     polling every 20 us: two or three extra context switches per
//     transaction (measured with perf: 1.6-1.8 per transaction with no
//     spare P, about 1.05 with one; sockperf makes 1.0). The spare P also
//     runs the control link and timers without disturbing the strands.
var procs struct {
	sync.Mutex
	strands, blocking int
}

// adjustProcs adds (or, negative, removes) a side's strands.
func adjustProcs(strands int, blocking bool) {
	if os.Getenv("GOMAXPROCS") != "" {
		return
	}
	procs.Lock()
	defer procs.Unlock()
	procs.strands += strands
	if blocking {
		procs.blocking += strands
	}
	runtime.GOMAXPROCS(procsFor(procs.strands, procs.blocking, runtime.NumCPU()))
}

// procsFor is the GOMAXPROCS for strands strands, blocking of them in
// blocking mode, on ncpu CPUs (see procs).
func procsFor(strands, blocking, ncpu int) int {
	n := strands
	if n < 1 || n > ncpu {
		n = ncpu
	}
	// auto picks blocking mode for at most AutoBlockingMax strands per CPU;
	// past that (--io blocking with many users) the spare Ps stop there.
	if b := min(blocking, AutoBlockingMax*ncpu) + 1; blocking > 0 && b > n {
		n = b
	}
	return n
}

// setIO resolves the side's I/O mode and counts its strands in GOMAXPROCS.
func (sd *side) setIO(mode string) error {
	blocking, err := chooseIO(mode, sd.activeStrands())
	if err != nil {
		return err
	}
	sd.blocking = blocking
	adjustProcs(sd.activeStrands(), blocking)
	sd.procsSet = true
	return nil
}

// activeStrands counts the strands with something to run on this side: on
// a server of a multi-host run, the strands of a group that never touches
// its host only sit their steps out, and must not count in GOMAXPROCS or
// in the choice of I/O mode.
func (sd *side) activeStrands() int {
	n := 0
	for _, s := range sd.strands {
		for i := range s.txns {
			if !s.txns[i].idle() {
				n++
				break
			}
		}
	}
	return n
}

// needFDs is how many descriptors this side will hold at most.
func needFDs(p *profile.Profile) int {
	n := 0
	for gi := range p.Groups {
		n += p.Groups[gi].Strands * p.Groups[gi].ConnsPerStrand()
	}
	return n
}

// hostOf is the peer an op uses: its connection's host, the first peer for
// an op naming none (and always on a server's side, whose peer is one).
func (sd *side) hostOf(f *profile.Flowop) int {
	if f.RemoteHost == "" || sd.hostIndex == nil {
		return 0
	}
	return sd.hostIndex[f.RemoteHost]
}

// setupListeners opens what this side's accept flowops need; locals[i] is
// this side's address toward peer i (the local address of its control
// connection). Peers reached from the same address share a listener per
// port: the data connection's header (run, strand, connection) tells them
// apart, and a strand's connection ids are distinct across hosts.
func (sd *side) setupListeners(locals []string) error {
	type lkey struct {
		local string
		port  int
	}
	tcpW := map[lkey]int{}
	id := 0
	for gi := range sd.prof.Groups {
		g := &sd.prof.Groups[gi]
		for ti := range g.Transactions {
			for _, f := range g.Transactions[ti].Flowops {
				if f.Type != profile.OpAccept || f.Elsewhere {
					continue
				}
				local := locals[sd.hostOf(&f)]
				if f.Protocol == "udp" {
					for i := 0; i < g.Strands; i++ {
						k := dataconn.Key{Strand: uint32(id + i), Conn: uint32(f.Conn)}
						if sd.udp[k] != nil {
							continue
						}
						ep, err := dataconn.ListenUDP(local, int(f.WndSz))
						if err != nil {
							return err
						}
						sd.udp[k] = ep
					}
					continue
				}
				lk := lkey{local, f.Port}
				if w, ok := tcpW[lk]; !ok || int(f.WndSz) > w {
					tcpW[lk] = int(f.WndSz)
				}
			}
		}
		id += g.Strands
	}
	keys := make([]lkey, 0, len(tcpW))
	for k := range tcpW {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].local != keys[j].local {
			return keys[i].local < keys[j].local
		}
		return keys[i].port < keys[j].port
	})
	opened := map[lkey]*dataconn.Acceptor{}
	for _, k := range keys {
		a, err := dataconn.Listen(k.local, k.port, tcpW[k], sd.runID, sd.fatal)
		if err != nil {
			return err
		}
		opened[k] = a
		sd.listeners = append(sd.listeners, a)
	}
	for i := range sd.peers {
		sd.peers[i].local = locals[i]
		for k, a := range opened {
			if k.local == locals[i] {
				sd.peers[i].acceptors[k.port] = a
			}
		}
	}
	return nil
}

// tcpPort is this side's default data listener toward peer i (0 = none).
func (sd *side) tcpPort(i int) int {
	if a := sd.peers[i].acceptors[0]; a != nil {
		return a.Port()
	}
	return 0
}

func (sd *side) udpPorts() []wire.UDPPort {
	var out []wire.UDPPort
	for k, ep := range sd.udp {
		out = append(out, wire.UDPPort{Strand: int(k.Strand), Conn: int(k.Conn), Port: ep.Port()})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Strand != out[j].Strand {
			return out[i].Strand < out[j].Strand
		}
		return out[i].Conn < out[j].Conn
	})
	return out
}

func (sd *side) setPeer(i int, host string, tcpPort int, udp []wire.UDPPort) {
	p := &sd.peers[i]
	p.host, p.tcpPort = host, tcpPort
	for _, u := range udp {
		p.udp[dataconn.Key{Strand: uint32(u.Strand), Conn: uint32(u.Conn)}] = u.Port
	}
}

// fatal records an acceptor failure; the run cannot go on.
func (sd *side) fatal(err error) {
	select {
	case sd.fatalCh <- err:
	default:
	}
}

// strandFailed records the first failing strand of a step.
func (sd *side) strandFailed(s *strand, err error) {
	sd.failMu.Lock()
	first := sd.failed == nil
	if first {
		sd.failed = fmt.Errorf("%s strand %d: %w", sd.role, s.id, err)
	}
	e := sd.failed
	sd.failMu.Unlock()
	if first {
		select {
		case sd.failCh <- e:
		default:
		}
	}
}

// runningStep is a step in progress on this side.
type runningStep struct {
	k     int
	ctl   *stepCtl
	start time.Time
	cpu0  sysstat.Sample
	done  chan struct{}
}

// startStep starts step k on every strand. durations (controller side
// only) ends every group's timed transaction at start + its duration.
func (sd *side) startStep(k int, timed bool) *runningStep {
	ctl := &stepCtl{deadlines: make([]time.Time, len(sd.prof.Groups))}
	rs := &runningStep{k: k, ctl: ctl, done: make(chan struct{})}
	// buffers are made when a step first needs them, before its CPU time is
	// taken (the strands are not running: no step is)
	for _, s := range sd.strands {
		if s.makeBuf(k) {
			sd.allocated = true
		}
	}
	rs.cpu0 = sysstat.Take()
	rs.start = rs.cpu0.At
	if timed {
		for gi := range sd.prof.Groups {
			g := &sd.prof.Groups[gi]
			if k < len(g.Transactions) && g.Transactions[k].Timed() {
				ctl.deadlines[gi] = rs.start.Add(g.Transactions[k].Duration)
			}
		}
	}
	var wg sync.WaitGroup
	for _, s := range sd.strands {
		s := s
		if k >= len(s.txns) || s.txns[k].idle() {
			s.runStep(k, ctl) // nothing to run: it returns at once, no goroutine needed
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.runStep(k, ctl)
		}()
	}
	go func() {
		wg.Wait()
		close(rs.done)
	}()
	return rs
}

// stop asks strands to end once they have completed targets[i] passes,
// and interrupts the ones already there.
func (sd *side) stop(rs *runningStep, targets []int64) {
	t := make([]int64, len(sd.strands))
	copy(t, targets)
	for _, s := range sd.strands {
		if rs.k < len(s.txns) && s.txns[rs.k].idle() {
			// a multi-host step with nothing on this host for the strand: it
			// ran no pass here, whatever the client counted
			t[s.id] = 0
		}
	}
	rs.ctl.targets = t
	rs.ctl.stop.Store(true)
	for _, s := range sd.strands {
		if s.stepPasses.Load() >= t[s.id] {
			s.interrupt()
		}
	}
}

// abort interrupts every strand now.
func (sd *side) abort(rs *runningStep) {
	if rs != nil {
		rs.ctl.aborted.Store(true)
	}
	sd.cancel()
	for _, s := range sd.strands {
		s.interrupt()
	}
}

// interruptAll interrupts every strand without marking an abort; used when
// stragglers do not reach their target in time.
func (sd *side) interruptAll() {
	for _, s := range sd.strands {
		s.interrupt()
	}
}

// passes returns the passes each strand completed in the step.
func (sd *side) passes() []int64 {
	out := make([]int64, len(sd.strands))
	for i, s := range sd.strands {
		out[i] = s.res.passes
	}
	return out
}

// collect builds this side's statistics of the finished step, and the
// merged transaction-time histogram of each group.
func (sd *side) collect(rs *runningStep) (*wire.SideStats, []*histogram.Histogram) {
	cpu1 := sysstat.Take()
	st := &wire.SideStats{Step: rs.k, CPU: sysstat.Delta(rs.cpu0, cpu1), PeakRSS: sysstat.PeakRSS()}
	hists := make([]*histogram.Histogram, len(sd.prof.Groups))
	byGroup := map[int]*wire.TxnStats{}
	var order []int
	for _, s := range sd.strands {
		r := &s.res
		if !r.ran {
			continue
		}
		ts := byGroup[s.group]
		if ts == nil {
			ts = &wire.TxnStats{Group: s.group, Flowops: make([]wire.FlowopStats, len(r.flow))}
			byGroup[s.group] = ts
			order = append(order, s.group)
			hists[s.group] = &histogram.Histogram{}
		}
		ts.Strands++
		if el := r.end.Sub(rs.start).Nanoseconds(); el > ts.ElapsedNs {
			ts.ElapsedNs = el
		}
		ts.BytesRead += r.bytesRead
		ts.BytesWritten += r.bytesWritten
		ts.Ops += r.ops
		ts.Passes += r.passes
		ts.Errors += r.errors
		ts.Retransmits += r.retransmits
		if r.cut {
			ts.CutStrands++
		}
		if ts.FirstError == "" && r.firstErr != nil {
			ts.FirstError = fmt.Sprintf("strand %d: %v", s.id, r.firstErr)
		}
		for i := range r.flow {
			if i < len(ts.Flowops) {
				ts.Flowops[i].Add(r.flow[i])
				if ts.Flowops[i].Type == "" {
					ts.Flowops[i].Type = r.flow[i].Type
				}
			}
		}
		hists[s.group].Merge(&r.hist)
	}
	sort.Ints(order)
	for _, g := range order {
		st.Txns = append(st.Txns, *byGroup[g])
	}
	return st, hists
}

// resumeAll clears interrupts between steps.
func (sd *side) resumeAll() {
	sd.failMu.Lock()
	sd.failed = nil
	sd.failMu.Unlock()
	select {
	case <-sd.failCh:
	default:
	}
	for _, s := range sd.strands {
		s.resume()
	}
}

// close releases every socket of the side.
func (sd *side) close() {
	sd.closeOnce.Do(func() {
		if sd.procsSet {
			adjustProcs(-sd.activeStrands(), sd.blocking)
		}
	})
	sd.cancel()
	for _, s := range sd.strands {
		s.closeAll()
	}
	for _, a := range sd.listeners {
		a.Close()
	}
	for _, u := range sd.udp {
		u.Close()
	}
}
