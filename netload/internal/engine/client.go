package engine

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"kvmtune/netload/internal/flowop"
	"kvmtune/netload/internal/histogram"
	"kvmtune/netload/internal/profile"
	"kvmtune/netload/internal/report"
	"kvmtune/netload/internal/sysstat"
	"kvmtune/netload/internal/wire"
)

// Version is netload's version, reported in every document.
var Version = "0.3.0"

// Error classes (report.ErrorInfo.Class) and the exit codes the CLI maps
// them to.
const (
	ClassUsage   = "usage"   // bad command line
	ClassProfile = "profile" // profile missing or invalid
	ClassConnect = "connect" // control connection could not be made
	ClassSetup   = "setup"   // the server refused the run (limits, listeners)
	ClassPeer    = "peer"    // the peer died or stopped answering
	ClassRun     = "run"     // the run started but an operation failed
)

// RunError is an error with its class.
type RunError struct {
	Class string
	Err   error
}

func (e *RunError) Error() string { return e.Err.Error() }
func (e *RunError) Unwrap() error { return e.Err }

func classed(class string, format string, a ...any) *RunError {
	return &RunError{Class: class, Err: fmt.Errorf(format, a...)}
}

// RunConfig describes one run from the controller side.
type RunConfig struct {
	Remote  string // host:port of `netload serve`
	Profile *profile.Profile
	Test    string // test name for the report (e.g. rr1c-1x1--1)
	Source  string // profile path or builtin:NAME
	XML     string // profile text, kept in the report
	Vars    map[string]string
	Token   string // the server's shared secret ("" = none)

	IOMode     string                // auto, blocking or poll (both sides)
	Interval   time.Duration         // 0 = no time series
	OnInterval func(report.Interval) // called for every interval row
	OnStep     func(report.Step)     // called after every step
	Logf       func(string, ...any)  // progress messages (nil = quiet)

	ConnectTimeout time.Duration // control connect and hello (default 5s)
	PeerTimeout    time.Duration // silence after which the peer is dead (default 10s)
	StepGrace      time.Duration // how long the server may take to end a step (default 15s)
	StallTimeout   time.Duration // no operation at all for this long ends the run (default 60s)
	// Drain is how long, after a timed transaction, the server waits for
	// what is still in flight on connections that are only closed
	// afterwards (default 1s; negative: until its step grace, then fail).
	// What has not arrived then is reported (short_passes), not waited for.
	Drain time.Duration
}

func (c *RunConfig) defaults() {
	if c.ConnectTimeout <= 0 {
		c.ConnectTimeout = 5 * time.Second
	}
	if c.PeerTimeout <= 0 {
		c.PeerTimeout = 10 * time.Second
	}
	if c.StepGrace <= 0 {
		c.StepGrace = 15 * time.Second
	}
	if c.StallTimeout <= 0 {
		c.StallTimeout = 60 * time.Second
	}
	if c.Drain == 0 {
		c.Drain = DefaultDrain
	}
	// a think or a paced gap longer than the stall timeout is not a stall
	for _, g := range c.Profile.Groups {
		for _, t := range g.Transactions {
			gap := time.Duration(0)
			if t.Rate > 0 {
				gap = time.Duration(float64(time.Second) / t.Rate)
			}
			for _, f := range t.Flowops {
				if f.Type == profile.OpThink {
					gap += f.Duration * time.Duration(f.Count)
				}
				if f.Timeout > gap {
					gap = f.Timeout
				}
			}
			if 2*gap+10*time.Second > c.StallTimeout {
				c.StallTimeout = 2*gap + 10*time.Second
			}
		}
	}
}

// DefaultDrain is RunConfig.Drain's default: on a healthy path the data
// still queued when a timed transaction ends arrives within milliseconds.
const DefaultDrain = time.Second

// stepTimed reports whether step k has a timed transaction in some group.
func stepTimed(p *profile.Profile, k int) bool {
	for gi := range p.Groups {
		if ts := p.Groups[gi].Transactions; k < len(ts) && ts[k].Timed() {
			return true
		}
	}
	return false
}

func hostInfo() *wire.HostInfo {
	h, _ := os.Hostname()
	hi := &wire.HostInfo{Hostname: h, PID: os.Getpid(), NCPU: runtime.NumCPU(), Version: Version}
	var u syscall.Utsname
	if syscall.Uname(&u) == nil {
		hi.Kernel = utsString(u.Release[:])
	}
	return hi
}

func utsString(b []int8) string {
	out := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		out = append(out, byte(c))
	}
	return string(out)
}

func newRunID() uint32 {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		return uint32(time.Now().UnixNano())
	}
	return binary.BigEndian.Uint32(b[:]) | 1
}

// Run drives one run against a server. It always returns a document
// (partial when the run failed); the error, if any, is a *RunError.
func Run(ctx context.Context, cfg RunConfig) (*report.Document, error) {
	cfg.defaults()
	doc := &report.Document{
		SchemaVersion: report.SchemaVersion,
		Tool:          report.Tool{Name: "netload", Version: Version},
		Test:          cfg.Test,
		Profile: report.ProfileInfo{Name: cfg.Profile.Name, Source: cfg.Source, Users: cfg.Profile.Strands(),
			XML: cfg.XML, Vars: cfg.Vars},
		StartedAt: time.Now().UTC(),
		Remote:    cfg.Remote,
		Client:    hostInfo(),
		Steps:     []report.Step{},
	}
	if cfg.Interval > 0 {
		doc.IntervalS = cfg.Interval.Seconds()
	}
	fail := func(err *RunError) (*report.Document, error) {
		doc.Error = &report.ErrorInfo{Class: err.Class, Message: err.Error()}
		doc.PeakRSSBytes.Client = sysstat.PeakRSS()
		return doc, err
	}
	if err := flowop.CheckFDs(needFDs(cfg.Profile)+2, "the client"); err != nil {
		return fail(&RunError{ClassSetup, err})
	}

	d := net.Dialer{Timeout: cfg.ConnectTimeout}
	nc, err := d.DialContext(ctx, "tcp", cfg.Remote)
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return fail(classed(ClassConnect, "cannot reach the server at %s: no answer within %v", cfg.Remote, cfg.ConnectTimeout))
		}
		return fail(classed(ClassConnect, "cannot reach the server at %s: %v", cfg.Remote, flowop.Explain(err)))
	}
	wc := wire.NewConn(nc)
	defer wc.Close()
	localHost := nc.LocalAddr().(*net.TCPAddr).IP.String()
	peerHost := nc.RemoteAddr().(*net.TCPAddr).IP.String()

	sd := newSide("client", cfg.Profile, newRunID())
	defer sd.close()
	if err := sd.setIO(cfg.IOMode); err != nil {
		return fail(&RunError{ClassUsage, err})
	}
	if err := sd.setupListeners(localHost); err != nil {
		return fail(&RunError{ClassSetup, err})
	}
	hello := &wire.Msg{Type: wire.THello, Magic: wire.Magic, Version: wire.Version, RunID: sd.runID, Token: cfg.Token,
		Profile: cfg.Profile, IOMode: cfg.IOMode, TCPPort: sd.tcpPort(), UDPPorts: sd.udpPorts(), Host: doc.Client}
	if err := wc.Send(hello); err != nil {
		return fail(classed(ClassConnect, "server at %s: %v", cfg.Remote, err))
	}
	m, err := wc.Recv(2 * cfg.ConnectTimeout)
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return fail(classed(ClassConnect, "the server at %s accepted the connection but did not answer within %v (is it `netload serve`?)", cfg.Remote, 2*cfg.ConnectTimeout))
		}
		return fail(classed(ClassConnect, "the server at %s closed the control connection during setup: %v", cfg.Remote, err))
	}
	switch m.Type {
	case wire.THelloOK:
	case wire.TError:
		return fail(classed(ClassSetup, "server refused the run: %s", m.Error))
	default:
		return fail(classed(ClassConnect, "the server at %s answered %q, not hello_ok", cfg.Remote, m.Type))
	}
	doc.Server = m.Host
	sd.setPeer(peerHost, m.TCPPort, m.UDPPorts)

	// reader: every message from the server; silence means a dead peer
	link := startControlLink(wc, cfg.PeerTimeout)
	defer link.close()
	msgs, readErr := link.msgs, link.readErr

	// interval sampler
	runStart := time.Now()
	var curStep atomic.Int64
	sampler := startSampler(sd, cfg, runStart, func() int { return int(curStep.Load()) })
	defer sampler.stop()

	peerErr := func(err error) *RunError {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return classed(ClassPeer, "the server stopped answering: no message for %v", cfg.PeerTimeout)
		}
		return classed(ClassPeer, "lost the server: %v", err)
	}

	var runErr *RunError
	var clientStats []*wire.SideStats
	var serverStats []*wire.SideStats
	var hists [][]*histogram.Histogram
	steps := cfg.Profile.Steps()

stepLoop:
	for k := 0; k < steps; k++ {
		curStep.Store(int64(k + 1))
		if err := wc.Send(&wire.Msg{Type: wire.TBegin, Step: k}); err != nil {
			runErr = peerErr(err)
			break
		}
		rs := sd.startStep(k, true)
		var stepErr *RunError
		peerDead := false
		stall := newStallWatch(sd, cfg.StallTimeout)
	wait:
		for {
			select {
			case <-rs.done:
				break wait
			case err := <-sd.failCh:
				if stepErr == nil {
					stepErr = &RunError{ClassRun, err}
				}
				sd.abort(rs)
			case err := <-sd.fatalCh:
				if stepErr == nil {
					stepErr = &RunError{ClassRun, fmt.Errorf("client: %w", err)}
				}
				sd.abort(rs)
			case m := <-msgs:
				if m.Type == wire.TError {
					if stepErr == nil {
						stepErr = classed(ClassRun, "server: %s", m.Error)
					}
					sd.abort(rs)
				}
			case err := <-readErr:
				runErr = peerErr(err)
				peerDead = true
				sd.abort(rs)
			case <-stall.C():
				if stall.stalled() && stepErr == nil {
					stepErr = classed(ClassRun, "no operation completed for %v in step %d", cfg.StallTimeout, k+1)
					sd.abort(rs)
				}
			case <-ctx.Done():
				if stepErr == nil {
					stepErr = classed(ClassRun, "interrupted")
				}
				sd.abort(rs)
			}
		}
		stall.stop()
		cst, chist := sd.collect(rs)
		var sst *wire.SideStats
		if !peerDead {
			end := &wire.Msg{Type: wire.TEnd, Step: k, Targets: sd.passes()}
			if cfg.Drain > 0 && stepTimed(cfg.Profile, k) {
				end.DrainMs = max(1, cfg.Drain.Milliseconds())
			}
			if err := wc.Send(end); err != nil {
				runErr = peerErr(err)
				peerDead = true
			}
		}
		if !peerDead {
			timer := time.NewTimer(cfg.StepGrace + cfg.PeerTimeout)
		ended:
			for {
				select {
				case m := <-msgs:
					switch m.Type {
					case wire.TEnded:
						sst = m.Stats
						break ended
					case wire.TError:
						if stepErr == nil {
							stepErr = classed(ClassRun, "server: %s", m.Error)
						}
					}
				case err := <-readErr:
					runErr = peerErr(err)
					peerDead = true
					break ended
				case <-timer.C:
					runErr = classed(ClassPeer, "the server did not end step %d within %v", k+1, cfg.StepGrace+cfg.PeerTimeout)
					peerDead = true
					break ended
				}
			}
			timer.Stop()
		}
		clientStats = append(clientStats, cst)
		serverStats = append(serverStats, sst)
		hists = append(hists, chist)
		step := buildStep(cfg.Profile, k, cst, sst, chist)
		doc.Steps = append(doc.Steps, step)
		if cfg.OnStep != nil {
			cfg.OnStep(step)
		}
		sd.resumeAll()
		if runErr == nil && stepErr == nil && sst != nil {
			for _, t := range sst.Txns {
				if t.Errors > 0 {
					stepErr = classed(ClassRun, "server: %s", t.FirstError)
					break
				}
			}
		}
		if runErr == nil && stepErr != nil {
			runErr = stepErr
		}
		if runErr != nil {
			break stepLoop
		}
	}
	sampler.stop()
	doc.Intervals = sampler.rows()

	if runErr == nil || runErr.Class != ClassPeer {
		// say goodbye; the server answers with its peak memory
		if err := wc.Send(&wire.Msg{Type: wire.TBye}); err == nil {
			timer := time.NewTimer(2 * time.Second)
		bye:
			for {
				select {
				case m := <-msgs:
					if m.Type == wire.TBye {
						if m.Stats != nil {
							doc.PeakRSSBytes.Server = m.Stats.PeakRSS
						}
						break bye
					}
				case <-readErr:
					break bye
				case <-timer.C:
					break bye
				}
			}
			timer.Stop()
		}
	}
	summarize(doc, cfg.Profile, clientStats, serverStats, hists)
	doc.PeakRSSBytes.Client = sysstat.PeakRSS()
	for _, s := range serverStats {
		if s != nil && s.PeakRSS > doc.PeakRSSBytes.Server {
			doc.PeakRSSBytes.Server = s.PeakRSS
		}
	}
	if runErr != nil {
		doc.Error = &report.ErrorInfo{Class: runErr.Class, Message: runErr.Error()}
		return doc, runErr
	}
	return doc, nil
}

// stallWatch notices when no strand completes any operation for a while.
type stallWatch struct {
	sd      *side
	limit   time.Duration
	t       *time.Ticker
	lastOps int64
	lastAt  time.Time
}

func newStallWatch(sd *side, limit time.Duration) *stallWatch {
	w := &stallWatch{sd: sd, limit: limit, t: time.NewTicker(time.Second), lastOps: -1, lastAt: time.Now()}
	return w
}

func (w *stallWatch) C() <-chan time.Time { return w.t.C }
func (w *stallWatch) stop()               { w.t.Stop() }

func (w *stallWatch) stalled() bool {
	var ops int64
	for _, s := range w.sd.strands {
		ops += s.ops.Load()
	}
	now := time.Now()
	if ops != w.lastOps {
		w.lastOps, w.lastAt = ops, now
		return false
	}
	return now.Sub(w.lastAt) >= w.limit
}

// buildStep turns both sides' statistics of step k into a report row.
func buildStep(p *profile.Profile, k int, cst, sst *wire.SideStats, hists []*histogram.Histogram) report.Step {
	st := report.Step{Index: k + 1}
	for gi := range p.Groups {
		g := &p.Groups[gi]
		if k < len(g.Transactions) && g.Transactions[k].Timed() {
			st.Timed = true
		}
	}
	st.CPU.Client = cst.CPU
	if sst != nil {
		st.CPU.Server = sst.CPU
	}
	for _, ct := range cst.Txns {
		g := &p.Groups[ct.Group]
		t := &g.Transactions[k]
		row := report.Txn{Group: ct.Group, GroupName: g.Name, Description: t.Describe(), Iterations: t.Iterations,
			DurationS: t.Duration.Seconds(), Rate: t.Rate, Strands: ct.Strands,
			ElapsedS: float64(ct.ElapsedNs) / 1e9, Client: ct}
		if h := hists[ct.Group]; h != nil {
			row.TxnTimeNs = h.Summarize()
		}
		if sst != nil {
			for i := range sst.Txns {
				if sst.Txns[i].Group == ct.Group {
					s := sst.Txns[i]
					row.Server = &s
				}
			}
		}
		if row.ElapsedS > st.ElapsedS {
			st.ElapsedS = row.ElapsedS
		}
		st.Txns = append(st.Txns, row)
	}
	return st
}

// measuredSteps picks the steps the summary covers.
func measuredSteps(p *profile.Profile, n int) []int {
	var timed, data []int
	for k := 0; k < n; k++ {
		isTimed, isData := false, false
		for gi := range p.Groups {
			g := &p.Groups[gi]
			if k >= len(g.Transactions) {
				continue
			}
			if g.Transactions[k].Timed() {
				isTimed = true
			}
			if !g.Transactions[k].Setup() {
				isData = true
			}
		}
		if isTimed {
			timed = append(timed, k)
		}
		if isData {
			data = append(data, k)
		}
	}
	if len(timed) > 0 {
		return timed
	}
	if len(data) > 0 {
		return data
	}
	all := make([]int, n)
	for i := range all {
		all[i] = i
	}
	return all
}

func summarize(doc *report.Document, p *profile.Profile, cs, ss []*wire.SideStats, hists [][]*histogram.Histogram) {
	sum := &doc.Summary
	sum.MeasuredSteps = []int{}
	var merged histogram.Histogram
	var ccpu, scpu sysstat.CPU
	for _, k := range measuredSteps(p, p.Steps()) {
		if k >= len(cs) {
			break // the run ended before this step
		}
		sum.MeasuredSteps = append(sum.MeasuredSteps, k+1)
		if k < len(doc.Steps) {
			doc.Steps[k].Measured = true
		}
		var elapsed int64
		for _, t := range cs[k].Txns {
			sum.BytesRead += t.BytesRead
			sum.BytesWritten += t.BytesWritten
			sum.Transactions += t.Passes
			sum.Operations += t.Ops
			sum.Errors += t.Errors
			sum.CutStrands += t.CutStrands
			if t.ElapsedNs > elapsed {
				elapsed = t.ElapsedNs
			}
		}
		sum.DurationS += float64(elapsed) / 1e9
		for _, h := range hists[k] {
			merged.Merge(h)
		}
		ccpu = ccpu.Add(cs[k].CPU)
		if ss[k] != nil {
			for _, t := range ss[k].Txns {
				sum.ServerBytes += t.BytesRead + t.BytesWritten
				sum.ServerOperations += t.Ops
				sum.ServerErrors += t.Errors
				sum.UndeliveredStrands += t.CutStrands
				sum.UndeliveredMessages += t.ShortPasses
			}
			scpu = scpu.Add(ss[k].CPU)
		}
	}
	for k := range cs {
		for _, t := range cs[k].Txns {
			sum.Retransmits += t.Retransmits
		}
		if k < len(ss) && ss[k] != nil {
			for _, t := range ss[k].Txns {
				sum.Retransmits += t.Retransmits
			}
		}
	}
	sum.Bytes = sum.BytesRead + sum.BytesWritten
	if sum.DurationS > 0 {
		sum.ThroughputBytesPerS = float64(sum.Bytes) / sum.DurationS
		sum.ThroughputBitsPerS = 8 * sum.ThroughputBytesPerS
		sum.TransactionsPerS = float64(sum.Transactions) / sum.DurationS
		sum.OperationsPerS = float64(sum.Operations) / sum.DurationS
	}
	if sum.Bytes > 0 {
		sum.BytesDifferencePct = 100 * float64(sum.ServerBytes-sum.Bytes) / float64(sum.Bytes)
	}
	sum.TxnTimeNs = merged.Summarize()
	if merged.Count() > 0 {
		snap := merged.Snapshot()
		doc.TxnTimeHistogram = &snap
	}
	doc.CPU.Client = report.Efficiency(ccpu, sum.Bytes, sum.Transactions)
	doc.CPU.Server = report.Efficiency(scpu, sum.Bytes, sum.Transactions)
}

// sampler produces the --interval time series.
type sampler struct {
	mu      sync.Mutex
	out     []report.Interval
	done    chan struct{}
	wg      sync.WaitGroup
	stopped bool
}

func startSampler(sd *side, cfg RunConfig, start time.Time, step func() int) *sampler {
	sp := &sampler{done: make(chan struct{})}
	if cfg.Interval <= 0 {
		return sp
	}
	totals := func() (b, o, p int64) {
		for _, s := range sd.strands {
			b += s.bytes.Load()
			o += s.ops.Load()
			p += s.passes.Load()
		}
		return
	}
	sp.wg.Add(1)
	go func() {
		defer sp.wg.Done()
		t := time.NewTicker(cfg.Interval)
		defer t.Stop()
		var lb, lo, lp int64 // counters start at zero with the run
		last := start
		emit := func(now time.Time) {
			b, o, p := totals()
			dt := now.Sub(last).Seconds()
			if dt <= 0 {
				return
			}
			row := report.Interval{TS: now.Sub(start).Seconds(), Step: step(), DurationS: dt,
				Bytes: b - lb, Transactions: p - lp, Operations: o - lo}
			row.ThroughputBps = 8 * float64(row.Bytes) / dt
			row.TransactionsPS = float64(row.Transactions) / dt
			row.OperationsPS = float64(row.Operations) / dt
			lb, lo, lp, last = b, o, p, now
			sp.mu.Lock()
			sp.out = append(sp.out, row)
			sp.mu.Unlock()
			if cfg.OnInterval != nil {
				cfg.OnInterval(row)
			}
		}
		for {
			select {
			case now := <-t.C:
				emit(now)
			case <-sp.done:
				b, o, _ := totals()
				if now := time.Now(); b != lb || o != lo || now.Sub(last) > cfg.Interval/10 {
					emit(now)
				}
				return
			}
		}
	}()
	return sp
}

func (sp *sampler) stop() {
	sp.mu.Lock()
	if sp.stopped {
		sp.mu.Unlock()
		return
	}
	sp.stopped = true
	sp.mu.Unlock()
	close(sp.done)
	sp.wg.Wait()
}

func (sp *sampler) rows() []report.Interval {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	return append([]report.Interval(nil), sp.out...)
}
