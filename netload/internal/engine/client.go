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
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"kvmtune/netload/internal/dataconn"
	"kvmtune/netload/internal/histogram"
	"kvmtune/netload/internal/profile"
	"kvmtune/netload/internal/report"
	"kvmtune/netload/internal/sysstat"
	"kvmtune/netload/internal/wire"
)

// Version is netload's version, reported in every document.
var Version = "0.4.1"

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
	Remote string // host:port of `netload serve`
	// Remotes, for a profile that names several remote hosts, is one server
	// per host, the first one also serving connections that name none (see Run).
	Remotes []Remote
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

// Remote is one server of a run that names several remote hosts.
type Remote struct {
	Name string // the profile's remotehost (resolved), as its flowops name it
	Addr string // host:port of the netload serve for it
}

// hostLink is the control connection to one server.
type hostLink struct {
	Remote
	wc     *wire.Conn
	link   *controlLink
	server *wire.HostInfo
	dead   bool  // lost: nothing more is sent to it
	rss    int64 // its peak memory, from its last stats or bye
	stats  []*wire.SideStats
}

// hostMsg and hostErr carry one server's control messages and its loss into
// the run's single loop.
type hostMsg struct {
	h int
	m *wire.Msg
}

type hostErr struct {
	h   int
	err error
}

// Run drives one run against its servers: cfg.Remote, or one per remote
// host (cfg.Remotes) for a profile that names several.
//
// With several hosts, one control connection goes to each server, and each
// gets its own view of the profile (profile.ServerView): the ops on other
// hosts' connections are marked Elsewhere and its strands leave them out.
// The client side runs the whole profile, every strand with its connections
// to every host. Steps are held together across hosts as uperf's master
// holds its slaves to one barrier: begin k goes to every server before the
// client's strands start, end k (with the client's pass counts) goes to
// every server once they stop, and step k+1 begins only when every server
// has ended step k. A server stops its strands at the client's count, which
// fits each host because every pass of a client strand runs the ops of that
// host once; a strand with no op on a host in a step sits it out there
// (target 0). Durations are only the client's: servers run until its count.
// The document merges the servers' statistics (Document.Servers keeps each
// host's share). It always returns a document (partial when the run
// failed); the error, if any, is a *RunError.
func Run(ctx context.Context, cfg RunConfig) (*report.Document, error) {
	cfg.defaults()
	remotes := cfg.Remotes
	if len(remotes) == 0 {
		remotes = []Remote{{Addr: cfg.Remote}}
	}
	multi := len(remotes) > 1
	addrs := make([]string, len(remotes))
	for i, r := range remotes {
		addrs[i] = r.Addr
	}
	doc := &report.Document{
		SchemaVersion: report.SchemaVersion,
		Tool:          report.Tool{Name: "netload", Version: Version},
		Test:          cfg.Test,
		Profile: report.ProfileInfo{Name: cfg.Profile.Name, Source: cfg.Source, Users: cfg.Profile.Strands(),
			XML: cfg.XML, Vars: cfg.Vars},
		StartedAt: time.Now().UTC(),
		Remote:    strings.Join(addrs, ","),
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
	// who names server h in messages: as before with one server, by its
	// remotehost with several
	who := func(h int) string {
		if !multi {
			return "the server"
		}
		return fmt.Sprintf("the server of remotehost %s", remotes[h].Name)
	}
	if err := dataconn.CheckFDs(needFDs(cfg.Profile)+2*len(remotes), "the client"); err != nil {
		return fail(&RunError{ClassSetup, err})
	}

	links := make([]*hostLink, len(remotes))
	locals := make([]string, len(remotes))
	peerHosts := make([]string, len(remotes))
	d := net.Dialer{Timeout: cfg.ConnectTimeout}
	for i, r := range remotes {
		nc, err := d.DialContext(ctx, "tcp", r.Addr)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return fail(classed(ClassConnect, "cannot reach %s at %s: no answer within %v", who(i), r.Addr, cfg.ConnectTimeout))
			}
			return fail(classed(ClassConnect, "cannot reach %s at %s: %v", who(i), r.Addr, dataconn.Explain(err)))
		}
		links[i] = &hostLink{Remote: r, wc: wire.NewConn(nc)}
		defer links[i].wc.Close()
		locals[i] = nc.LocalAddr().(*net.TCPAddr).IP.String()
		peerHosts[i] = nc.RemoteAddr().(*net.TCPAddr).IP.String()
	}

	var hostNames []string
	if multi {
		for _, r := range remotes {
			hostNames = append(hostNames, r.Name)
		}
	}
	sd := newSide("client", cfg.Profile, newRunID(), hostNames)
	defer sd.close()
	if err := sd.setIO(cfg.IOMode); err != nil {
		return fail(&RunError{ClassUsage, err})
	}
	if err := sd.setupListeners(locals); err != nil {
		return fail(&RunError{ClassSetup, err})
	}
	// servers that accepted the hello wait for steps: tell them the run is off
	abortAccepted := func(upTo int) {
		for _, l := range links[:upTo] {
			_ = l.wc.Send(&wire.Msg{Type: wire.TAbort})
		}
	}
	for i, l := range links {
		view, version := cfg.Profile, wire.MinVersion
		if multi {
			view = cfg.Profile.ServerView(hostNames, i)
			if view.HasElsewhere() {
				version = wire.Version
			}
		}
		hello := &wire.Msg{Type: wire.THello, Magic: wire.Magic, Version: version, RunID: sd.runID, Token: cfg.Token,
			Profile: view, IOMode: cfg.IOMode, TCPPort: sd.tcpPort(i), UDPPorts: sd.udpPorts(), Host: doc.Client}
		if err := l.wc.Send(hello); err != nil {
			abortAccepted(i)
			return fail(classed(ClassConnect, "%s at %s: %v", who(i), l.Addr, err))
		}
		m, err := l.wc.Recv(2 * cfg.ConnectTimeout)
		if err != nil {
			abortAccepted(i)
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return fail(classed(ClassConnect, "%s at %s accepted the connection but did not answer within %v (is it `netload serve`?)", who(i), l.Addr, 2*cfg.ConnectTimeout))
			}
			return fail(classed(ClassConnect, "%s at %s closed the control connection during setup: %v", who(i), l.Addr, err))
		}
		switch m.Type {
		case wire.THelloOK:
		case wire.TError:
			abortAccepted(i)
			if multi {
				return fail(classed(ClassSetup, "%s at %s refused the run: %s", who(i), l.Addr, m.Error))
			}
			return fail(classed(ClassSetup, "server refused the run: %s", m.Error))
		default:
			abortAccepted(i)
			return fail(classed(ClassConnect, "%s at %s answered %q, not hello_ok", who(i), l.Addr, m.Type))
		}
		l.server = m.Host
		sd.setPeer(i, peerHosts[i], m.TCPPort, m.UDPPorts)
	}
	doc.Server = links[0].server

	// every server's messages come into one loop; silence means a dead peer
	msgs := make(chan hostMsg, 16*len(links))
	readErr := make(chan hostErr, len(links))
	stopFwd := make(chan struct{})
	var fwd sync.WaitGroup
	for i, l := range links {
		l.link = startControlLink(l.wc, cfg.PeerTimeout)
		fwd.Add(1)
		go func(h int, cl *controlLink) {
			defer fwd.Done()
			// forward passes one message on; false once the run stops listening
			forward := func(m *wire.Msg) bool {
				select {
				case msgs <- hostMsg{h, m}:
					return true
				case <-stopFwd:
					return false
				}
			}
			for {
				select {
				case m := <-cl.msgs:
					if !forward(m) {
						return
					}
				case err := <-cl.readErr:
					// what the server sent before it hung up comes first (its bye)
					for drained := false; !drained; {
						select {
						case m := <-cl.msgs:
							if !forward(m) {
								return
							}
						default:
							drained = true
						}
					}
					readErr <- hostErr{h, err}
					return
				case <-stopFwd:
					return
				}
			}
		}(i, l.link)
	}
	defer func() {
		close(stopFwd)
		fwd.Wait()
		for _, l := range links {
			l.link.close()
		}
	}()

	// interval sampler
	runStart := time.Now()
	var curStep atomic.Int64
	sampler := startSampler(sd, cfg, runStart, func() int { return int(curStep.Load()) })
	defer sampler.stop()

	peerErr := func(h int, err error) *RunError {
		links[h].dead = true
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return classed(ClassPeer, "%s stopped answering: no message for %v", who(h), cfg.PeerTimeout)
		}
		if multi {
			return classed(ClassPeer, "lost %s: %v", who(h), err)
		}
		return classed(ClassPeer, "lost the server: %v", err)
	}
	serverSays := func(h int, msg string) *RunError {
		if multi {
			return classed(ClassRun, "server of remotehost %s: %s", remotes[h].Name, msg)
		}
		return classed(ClassRun, "server: %s", msg)
	}

	var runErr *RunError
	var clientStats []*wire.SideStats
	var serverStats []*wire.SideStats
	var hists [][]*histogram.Histogram
	steps := cfg.Profile.Steps()

stepLoop:
	for k := 0; k < steps; k++ {
		curStep.Store(int64(k + 1))
		for h, l := range links {
			if err := l.wc.Send(&wire.Msg{Type: wire.TBegin, Step: k}); err != nil {
				runErr = peerErr(h, err)
				break stepLoop
			}
		}
		rs := sd.startStep(k, true)
		var stepErr *RunError
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
			case hm := <-msgs:
				if hm.m.Type == wire.TError {
					if stepErr == nil {
						stepErr = serverSays(hm.h, hm.m.Error)
					}
					sd.abort(rs)
				}
			case he := <-readErr:
				if runErr == nil {
					runErr = peerErr(he.h, he.err)
				}
				links[he.h].dead = true
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
		// every live server ends the step at the client's counts; their
		// accounts come back in any order
		ssts := make([]*wire.SideStats, len(links))
		pending := 0
		for h, l := range links {
			if l.dead {
				continue
			}
			end := &wire.Msg{Type: wire.TEnd, Step: k, Targets: sd.passes()}
			if cfg.Drain > 0 && stepTimed(cfg.Profile, k) {
				end.DrainMs = max(1, cfg.Drain.Milliseconds())
			}
			if err := l.wc.Send(end); err != nil {
				if runErr == nil {
					runErr = peerErr(h, err)
				}
				continue
			}
			pending++
		}
		if pending > 0 {
			timer := time.NewTimer(cfg.StepGrace + cfg.PeerTimeout)
		ended:
			for pending > 0 {
				select {
				case hm := <-msgs:
					switch hm.m.Type {
					case wire.TEnded:
						if ssts[hm.h] == nil {
							ssts[hm.h] = hm.m.Stats
							pending--
						}
					case wire.TError:
						if stepErr == nil {
							stepErr = serverSays(hm.h, hm.m.Error)
						}
					}
				case he := <-readErr:
					if runErr == nil {
						runErr = peerErr(he.h, he.err)
					}
					links[he.h].dead = true
					if ssts[he.h] == nil {
						pending--
					}
				case <-timer.C:
					for h, l := range links {
						if !l.dead && ssts[h] == nil {
							l.dead = true
							if runErr == nil {
								runErr = classed(ClassPeer, "%s did not end step %d within %v", who(h), k+1, cfg.StepGrace+cfg.PeerTimeout)
							}
						}
					}
					break ended
				}
			}
			timer.Stop()
		}
		for h, l := range links {
			l.stats = append(l.stats, ssts[h])
		}
		sst := mergeServers(ssts)
		clientStats = append(clientStats, cst)
		serverStats = append(serverStats, sst)
		hists = append(hists, chist)
		step := buildStep(cfg.Profile, k, cst, sst, chist)
		doc.Steps = append(doc.Steps, step)
		if cfg.OnStep != nil {
			cfg.OnStep(step)
		}
		sd.resumeAll()
		if runErr == nil && stepErr == nil {
			for h, s := range ssts {
				if s == nil {
					continue
				}
				for _, t := range s.Txns {
					if t.Errors > 0 && stepErr == nil {
						stepErr = serverSays(h, t.FirstError)
					}
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

	// say goodbye to every server still there; each answers with its peak
	// memory and then hangs up (that hang-up must not count for another host)
	waiting := map[int]bool{}
	for h, l := range links {
		if !l.dead && l.wc.Send(&wire.Msg{Type: wire.TBye}) == nil {
			waiting[h] = true
		}
	}
	if len(waiting) > 0 {
		timer := time.NewTimer(2 * time.Second)
	bye:
		for len(waiting) > 0 {
			select {
			case hm := <-msgs:
				if hm.m.Type == wire.TBye {
					if hm.m.Stats != nil {
						links[hm.h].rss = max(links[hm.h].rss, hm.m.Stats.PeakRSS)
					}
					delete(waiting, hm.h)
				}
			case he := <-readErr:
				delete(waiting, he.h)
			case <-timer.C:
				break bye
			}
		}
		timer.Stop()
	}
	summarize(doc, cfg.Profile, clientStats, serverStats, hists)
	doc.PeakRSSBytes.Client = sysstat.PeakRSS()
	for _, l := range links {
		for _, s := range l.stats {
			if s != nil {
				l.rss = max(l.rss, s.PeakRSS)
			}
		}
		doc.PeakRSSBytes.Server = max(doc.PeakRSSBytes.Server, l.rss)
	}
	if multi {
		doc.Servers = serverShares(doc, cfg.Profile, links)
	}
	if runErr != nil {
		doc.Error = &report.ErrorInfo{Class: runErr.Class, Message: runErr.Error()}
		return doc, runErr
	}
	return doc, nil
}

// mergeServers combines the servers' accounts of one step into the one the
// report's rows show: for each group, bytes, operations and errors add up
// over the hosts (so do retransmits and what was still in flight); strands,
// passes and elapsed time are the largest host's
// (every host runs the same strands the same number of passes); flowop
// statistics merge slot by slot (a slot counts on the host that runs it).
// nil when no server answered.
func mergeServers(all []*wire.SideStats) *wire.SideStats {
	var out *wire.SideStats
	for _, s := range all {
		if s == nil {
			continue
		}
		if out == nil {
			out = &wire.SideStats{Step: s.Step, CPU: s.CPU, PeakRSS: s.PeakRSS}
		} else {
			out.CPU = out.CPU.Beside(s.CPU)
			out.PeakRSS = max(out.PeakRSS, s.PeakRSS)
		}
	txns:
		for _, t := range s.Txns {
			for i := range out.Txns {
				o := &out.Txns[i]
				if o.Group != t.Group {
					continue
				}
				o.Strands = max(o.Strands, t.Strands)
				o.Passes = max(o.Passes, t.Passes)
				o.ElapsedNs = max(o.ElapsedNs, t.ElapsedNs)
				o.BytesRead += t.BytesRead
				o.BytesWritten += t.BytesWritten
				o.Ops += t.Ops
				o.Errors += t.Errors
				o.Retransmits += t.Retransmits
				o.CutStrands += t.CutStrands
				o.ShortPasses += t.ShortPasses
				if o.FirstError == "" {
					o.FirstError = t.FirstError
				}
				for j := range t.Flowops {
					if j < len(o.Flowops) {
						o.Flowops[j].Add(t.Flowops[j])
					}
				}
				continue txns
			}
			t.Flowops = append([]wire.FlowopStats(nil), t.Flowops...)
			out.Txns = append(out.Txns, t)
		}
	}
	if out != nil {
		sort.Slice(out.Txns, func(i, j int) bool { return out.Txns[i].Group < out.Txns[j].Group })
	}
	return out
}

// serverShares is each host's part of the measured phase in a multi-host run.
func serverShares(doc *report.Document, p *profile.Profile, links []*hostLink) []report.ServerShare {
	out := make([]report.ServerShare, len(links))
	for h, l := range links {
		sh := report.ServerShare{Remotehost: l.Name, Remote: l.Addr, Host: l.server, PeakRSSBytes: l.rss}
		var cpu sysstat.CPU
		for _, k := range doc.Summary.MeasuredSteps {
			if k-1 >= len(l.stats) || l.stats[k-1] == nil {
				continue
			}
			s := l.stats[k-1]
			for _, t := range s.Txns {
				sh.Bytes += t.BytesRead + t.BytesWritten
				sh.Operations += t.Ops
				sh.Errors += t.Errors
			}
			cpu = cpu.Add(s.CPU)
		}
		sh.CPU = report.Efficiency(cpu, doc.Summary.Bytes, doc.Summary.Transactions)
		out[h] = sh
	}
	return out
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
