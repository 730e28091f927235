package engine

import (
	"context"
	"errors"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"kvmtune/netload/internal/dataconn"
	"kvmtune/netload/internal/profile"
	"kvmtune/netload/internal/report"
	"kvmtune/netload/internal/wire"
	"kvmtune/netload/profiles"
)

func startServer(t *testing.T) (*Server, string) {
	t.Helper()
	return startServerAt(t, "127.0.0.1:0", nil)
}

// startServerAt starts a server on addr; logf, when given, receives its log.
func startServerAt(t *testing.T, addr string, logf func(string, ...any)) (*Server, string) {
	t.Helper()
	srv, err := Listen(addr)
	if err != nil {
		t.Fatal(err)
	}
	srv.PeerTimeout = 3 * time.Second
	srv.StepGrace = 3 * time.Second
	srv.Logf = logf
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { srv.Serve(ctx); close(done) }()
	t.Cleanup(func() {
		cancel()
		srv.Close()
		<-done
	})
	return srv, srv.Addr().String()
}

func builtin(t *testing.T, name string, users int, vars map[string]string) *profile.Profile {
	t.Helper()
	w, err := profile.ParseWorkloadName(name)
	if err != nil {
		t.Fatal(err)
	}
	v := map[string]string{"h": "127.0.0.1", "nprocs": strconv.Itoa(users), "duration": "1s"}
	for k, x := range vars {
		v[k] = x
	}
	p, err := profile.Parse([]byte(w.XML()), name, profile.MapLookup(v, nil))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// withIterations turns every timed transaction into n iterations.
func withIterations(p *profile.Profile, n int64) *profile.Profile {
	for gi := range p.Groups {
		for ti := range p.Groups[gi].Transactions {
			tx := &p.Groups[gi].Transactions[ti]
			if tx.Timed() {
				tx.Duration, tx.Iterations = 0, n
			}
		}
	}
	return p
}

func run(t *testing.T, addr string, p *profile.Profile, mod func(*RunConfig)) (*report.Document, error) {
	t.Helper()
	cfg := RunConfig{Remote: addr, Profile: p, Test: p.Name, PeerTimeout: 3 * time.Second, StepGrace: 3 * time.Second}
	if mod != nil {
		mod(&cfg)
	}
	doc, err := Run(context.Background(), cfg)
	if doc == nil {
		t.Fatal("Run returned no document")
	}
	return doc, err
}

// A loopback run of each built-in workload moves exactly the bytes the
// profile says, on both sides.
func TestBuiltinWorkloadsMoveExactBytes(t *testing.T) {
	_, addr := startServer(t)
	cases := []struct {
		name  string
		users int
		iters int64
		read  int64 // client bytes read per pass
		write int64
	}{
		{"rr1c-1x1", 3, 500, 1, 1},
		{"rr1c-200x1000", 4, 300, 1000, 200},
		{"rr1c-1000x30k", 2, 100, 30720, 1000},
		{"str-readx30k", 3, 200, 30720, 0},
		{"str-writex30k", 3, 200, 0, 30720},
	}
	for _, mode := range []string{IOBlocking, IOPoll} {
		for _, c := range cases {
			t.Run(mode+"/"+c.name, func(t *testing.T) {
				p := withIterations(builtin(t, c.name, c.users, nil), c.iters)
				d, err := run(t, addr, p, func(c *RunConfig) { c.IOMode = mode })
				if err != nil {
					t.Fatalf("run: %v", err)
				}
				passes := int64(c.users) * c.iters
				s := d.Summary
				if s.Transactions != passes {
					t.Fatalf("transactions %d, want %d", s.Transactions, passes)
				}
				if s.BytesRead != passes*c.read || s.BytesWritten != passes*c.write {
					t.Fatalf("client read %d written %d, want %d and %d", s.BytesRead, s.BytesWritten, passes*c.read, passes*c.write)
				}
				st := d.Steps[1].Txns[0]
				if st.Server == nil {
					t.Fatal("no server statistics")
				}
				if st.Server.BytesRead != s.BytesWritten || st.Server.BytesWritten != s.BytesRead {
					t.Fatalf("server read %d written %d, client wrote %d read %d", st.Server.BytesRead, st.Server.BytesWritten, s.BytesWritten, s.BytesRead)
				}
				if st.Server.Passes != passes {
					t.Fatalf("server passes %d, want %d", st.Server.Passes, passes)
				}
				if s.Errors != 0 || s.ServerErrors != 0 || d.Error != nil {
					t.Fatalf("errors: %d client, %d server, %v", s.Errors, s.ServerErrors, d.Error)
				}
				if s.TxnTimeNs.Count != uint64(passes) || s.TxnTimeNs.Min == 0 || s.TxnTimeNs.P50 < s.TxnTimeNs.Min || s.TxnTimeNs.P999 > s.TxnTimeNs.Max {
					t.Fatalf("transaction time summary %+v", s.TxnTimeNs)
				}
				if s.BytesDifferencePct != 0 {
					t.Fatalf("difference %v%%", s.BytesDifferencePct)
				}
				if len(d.Steps) != 3 || d.Steps[0].Txns[0].Client.Passes != int64(c.users) || d.Steps[2].Txns[0].Client.Passes != int64(c.users) {
					t.Fatalf("connect/disconnect steps wrong: %+v", d.Steps)
				}
				if d.CPU.Client.ProcS <= 0 || d.CPU.Client.ProcessCPUSPerMB <= 0 || d.CPU.Client.ProcessCPUUsPerTx <= 0 {
					t.Fatalf("client CPU not measured: %+v", d.CPU.Client)
				}
				if d.CPU.Server.WallS <= 0 {
					t.Fatalf("server CPU not measured: %+v", d.CPU.Server)
				}
			})
		}
	}
}

// Timed runs: the client's bytes are exactly its passes times the bytes of
// a pass, and the server agrees for request/response and for writes.
func TestTimedRuns(t *testing.T) {
	_, addr := startServer(t)
	for _, mode := range []string{IOBlocking, IOPoll} {
		for _, name := range []string{"rr1c-200x1000", "str-writex30k", "str-readx30k"} {
			t.Run(mode+"/"+name, func(t *testing.T) {
				p := builtin(t, name, 2, map[string]string{"duration": "400m"})
				start := time.Now()
				d, err := run(t, addr, p, func(c *RunConfig) { c.Interval = 100 * time.Millisecond; c.IOMode = mode })
				if err != nil {
					t.Fatal(err)
				}
				if el := time.Since(start); el > 5*time.Second {
					t.Fatalf("a 400 ms run took %v", el)
				}
				s := d.Summary
				if s.DurationS < 0.4 || s.DurationS > 1.5 {
					t.Fatalf("timed phase %.3fs, want about 0.4s", s.DurationS)
				}
				r, w := p.Groups[0].Transactions[1].BytesPerPass()
				if s.Transactions == 0 || s.BytesRead != s.Transactions*r || s.BytesWritten != s.Transactions*w {
					t.Fatalf("%d passes moved %d/%d bytes; want %d/%d", s.Transactions, s.BytesRead, s.BytesWritten, s.Transactions*r, s.Transactions*w)
				}
				switch name {
				case "str-readx30k":
					if s.ServerBytes < s.Bytes {
						t.Fatalf("server wrote %d, client read %d", s.ServerBytes, s.Bytes)
					}
				case "rr1c-200x1000":
					// a client pass cut at the end of the measured time may have had its request
					// answered already: at most one pass per user more on the server
					if extra := s.ServerBytes - s.Bytes; extra < 0 || extra > int64(2)*(r+w) {
						t.Fatalf("server moved %d bytes, client %d", s.ServerBytes, s.Bytes)
					}
				default:
					if s.ServerBytes != s.Bytes {
						t.Fatalf("server moved %d bytes, client %d", s.ServerBytes, s.Bytes)
					}
				}
				if len(d.Intervals) < 3 {
					t.Fatalf("%d interval rows, want about 5", len(d.Intervals))
				}
				var ib int64
				for _, iv := range d.Intervals {
					ib += iv.Bytes
				}
				if ib < s.Bytes {
					t.Fatalf("interval rows add up to %d bytes, measured phase %d", ib, s.Bytes)
				}
			})
		}
	}
}

func loadShipped(t *testing.T, file string, vars map[string]string) *profile.Profile {
	t.Helper()
	src, err := profiles.FS.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	v := map[string]string{"h": "127.0.0.1", "nthr": "2", "nprocs": "2", "duration": "1"}
	for k, x := range vars {
		v[k] = x
	}
	p, err := profile.Parse(src, file, profile.MapLookup(v, nil))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestShippedExamplesRun(t *testing.T) {
	_, addr := startServer(t)
	t.Run("two groups, named connections", func(t *testing.T) {
		p := loadShipped(t, "two-conns-two-groups.xml", nil)
		d, err := run(t, addr, p, nil)
		if err != nil {
			t.Fatal(err)
		}
		st := d.Steps[1]
		if len(st.Txns) != 2 {
			t.Fatalf("%d groups in step 2", len(st.Txns))
		}
		rr, str := st.Txns[0].Client, st.Txns[1].Client
		if rr.BytesWritten != 2*1000*110 || rr.BytesRead != 2*1000*(100+2048) {
			t.Fatalf("rr group moved %d/%d", rr.BytesWritten, rr.BytesRead)
		}
		if str.BytesWritten != 500*65536 || str.BytesRead != 0 {
			t.Fatalf("stream group moved %d/%d", str.BytesWritten, str.BytesRead)
		}
		if st.Txns[1].Server.BytesRead != 500*65536 {
			t.Fatalf("server read %d", st.Txns[1].Server.BytesRead)
		}
	})
	t.Run("client accepts, server connects", func(t *testing.T) {
		p := withIterations(loadShipped(t, "netperf-rr-accept.xml", nil), 1000)
		d, err := run(t, addr, p, nil)
		if err != nil {
			t.Fatal(err)
		}
		if d.Summary.Transactions != 1000 || d.Summary.Bytes != 2000 {
			t.Fatalf("%d transactions, %d bytes", d.Summary.Transactions, d.Summary.Bytes)
		}
	})
	t.Run("udp", func(t *testing.T) {
		p := withIterations(loadShipped(t, "udp-rr.xml", nil), 300)
		d, err := run(t, addr, p, nil)
		if err != nil {
			t.Fatal(err)
		}
		if d.Summary.Transactions != 600 || d.Summary.BytesRead != 600*64 || d.Summary.BytesWritten != 600*64 {
			t.Fatalf("%+v", d.Summary)
		}
	})
	t.Run("connect per transaction", func(t *testing.T) {
		p := loadShipped(t, "crr.xml", nil)
		p.Groups[0].Transactions[0].Duration = 300 * time.Millisecond
		d, err := run(t, addr, p, nil)
		if err != nil {
			t.Fatal(err)
		}
		s := d.Summary
		if s.Transactions < 10 || s.BytesWritten != 64*s.Transactions || s.BytesRead != 1024*s.Transactions {
			t.Fatalf("%+v", s)
		}
		if s.Operations != 4*s.Transactions {
			t.Fatalf("%d operations for %d transactions", s.Operations, s.Transactions)
		}
	})
	t.Run("rate", func(t *testing.T) {
		p := loadShipped(t, "paced-think.xml", nil)
		p.Groups[0].Transactions[1].Duration = time.Second
		d, err := run(t, addr, p, nil)
		if err != nil {
			t.Fatal(err)
		}
		// 5 users x 100/s for 1 s
		if tr := d.Summary.Transactions; tr < 300 || tr > 520 {
			t.Fatalf("%d transactions, want about 500", tr)
		}
		if d.Summary.TxnTimeNs.Min < uint64(2*time.Millisecond) {
			t.Fatalf("transactions shorter than their 2 ms think: %+v", d.Summary.TxnTimeNs)
		}
	})
}

func TestRefusedRemote(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // now nothing listens there
	p := builtin(t, "rr1c-1x1", 1, nil)
	d, err := run(t, addr, p, nil)
	var re *RunError
	if !errors.As(err, &re) || re.Class != ClassConnect {
		t.Fatalf("error %v, want a connect error", err)
	}
	if d.Error == nil || d.Error.Class != ClassConnect {
		t.Fatalf("document error %+v", d.Error)
	}
}

// A server that accepts but never speaks: setup ends with a clear error.
func TestSilentServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	p := builtin(t, "rr1c-1x1", 1, nil)
	start := time.Now()
	_, err = run(t, ln.Addr().String(), p, func(c *RunConfig) { c.ConnectTimeout = 500 * time.Millisecond })
	var re *RunError
	if !errors.As(err, &re) || re.Class != ClassConnect {
		t.Fatalf("error %v, want a connect error", err)
	}
	if el := time.Since(start); el > 8*time.Second {
		t.Fatalf("took %v", el)
	}
}

// hungServer completes the handshake, accepts data connections and then
// never answers again: no data, no heartbeats.
func hungServer(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	data, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var held []net.Conn
	hold := func(c net.Conn) {
		mu.Lock()
		held = append(held, c)
		mu.Unlock()
	}
	done := make(chan struct{})
	t.Cleanup(func() {
		ln.Close()
		data.Close()
		<-done
		mu.Lock()
		for _, c := range held {
			c.Close()
		}
		mu.Unlock()
	})
	go func() {
		for {
			c, err := data.Accept()
			if err != nil {
				return
			}
			hold(c)
		}
	}()
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		hold(c)
		wc := wire.NewConn(c)
		if _, err := wc.Recv(5 * time.Second); err != nil {
			return
		}
		wc.Send(&wire.Msg{Type: wire.THelloOK, Version: wire.Version, TCPPort: data.Addr().(*net.TCPAddr).Port})
		// then silence; drain what the client sends
		for {
			if _, err := wc.Recv(0); err != nil {
				return
			}
		}
	}()
	return ln.Addr().String()
}

func TestHungPeerEndsRun(t *testing.T) {
	addr := hungServer(t)
	p := builtin(t, "rr1c-1x1", 2, map[string]string{"duration": "60"})
	start := time.Now()
	d, err := run(t, addr, p, func(c *RunConfig) { c.PeerTimeout = time.Second })
	el := time.Since(start)
	var re *RunError
	if !errors.As(err, &re) || re.Class != ClassPeer {
		t.Fatalf("error %v, want a peer error", err)
	}
	if el > 6*time.Second {
		t.Fatalf("a hung peer held the run for %v", el)
	}
	if d.Error == nil || len(d.Steps) == 0 {
		t.Fatalf("want a partial document with an error, got %+v", d.Error)
	}
}

// A server that dies in the middle of a 60 s run ends it quickly, with what
// was measured so far.
func TestDeadPeerEndsRun(t *testing.T) {
	srv, addr := startServer(t)
	p := builtin(t, "rr1c-200x1000", 3, map[string]string{"duration": "60"})
	go func() {
		time.Sleep(700 * time.Millisecond)
		srv.Close()
	}()
	start := time.Now()
	d, err := run(t, addr, p, nil)
	el := time.Since(start)
	var re *RunError
	if !errors.As(err, &re) || (re.Class != ClassPeer && re.Class != ClassRun) {
		t.Fatalf("error %v, want the peer's death", err)
	}
	if el > 6*time.Second {
		t.Fatalf("run took %v after the server died", el)
	}
	if len(d.Steps) < 2 || d.Steps[1].Txns[0].Client.Passes == 0 {
		t.Fatalf("nothing measured before the server died: %+v", d.Steps)
	}
	if d.Summary.Transactions == 0 {
		t.Fatalf("summary lost the measured transactions")
	}
}

// A client that dies leaves the server ready for the next one.
func TestServerSurvivesClientDeath(t *testing.T) {
	_, addr := startServer(t)
	p := builtin(t, "rr1c-1x1", 2, map[string]string{"duration": "60"})
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		time.Sleep(300 * time.Millisecond)
		cancel()
	}()
	start := time.Now()
	_, err := Run(ctx, RunConfig{Remote: addr, Profile: p, PeerTimeout: 2 * time.Second})
	if err == nil || time.Since(start) > 5*time.Second {
		t.Fatalf("cancelled run: %v after %v", err, time.Since(start))
	}
	p2 := withIterations(builtin(t, "rr1c-1x1", 2, nil), 100)
	d, err := run(t, addr, p2, nil)
	if err != nil || d.Summary.Transactions != 200 {
		t.Fatalf("next run: %v, %d transactions", err, d.Summary.Transactions)
	}
}

func TestEveryFlowopOfTheTableHasAnExecutor(t *testing.T) {
	if err := checkExecutors(); err != nil {
		t.Fatal(err)
	}
	for _, sp := range profile.Flowops {
		if !sp.Op.Known() || sp.Opposite.Opposite() != sp.Op {
			t.Errorf("flowop %s: opposite %s does not lead back", sp.Op, sp.Opposite)
		}
	}
}

// After a timed step, a server strand short of the client's count on a
// connection that is only closed afterwards (data still in flight, as
// behind a sender's retransmission timeout) waits the client's drain time,
// then reports the shortfall instead of failing the step. Without a drain
// time it waits its step grace and fails, as before.
func TestServerDrainReportsWhatIsStillInFlight(t *testing.T) {
	srv, addr := startServer(t) // its step grace: 3 s
	p := builtin(t, "str-writex30k", 1, map[string]string{"duration": "1s"})
	msg := int(p.Groups[0].Transactions[1].Flowops[0].Size)
	for _, drain := range []time.Duration{300 * time.Millisecond, 0} {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		wc := wire.NewConn(nc)
		runID := uint32(77)
		if err := wc.Send(&wire.Msg{Type: wire.THello, Magic: wire.Magic, Version: wire.Version, RunID: runID, Profile: p}); err != nil {
			t.Fatal(err)
		}
		ok, err := wc.Recv(3 * time.Second)
		if err != nil || ok.Type != wire.THelloOK {
			t.Fatalf("hello: %+v %v", ok, err)
		}
		// heartbeats, as a real client sends them: the step grace below is as
		// long as the server's peer timeout, and a silent client would race it
		hbStop := make(chan struct{})
		go func() {
			tick := time.NewTicker(time.Second)
			defer tick.Stop()
			for {
				select {
				case <-tick.C:
					_ = wc.Send(&wire.Msg{Type: wire.THB})
				case <-hbStop:
					return
				}
			}
		}()
		step := func(k int, targets []int64, drainMs int64, work func()) (*wire.Msg, time.Duration) {
			t.Helper()
			if err := wc.Send(&wire.Msg{Type: wire.TBegin, Step: k}); err != nil {
				t.Fatal(err)
			}
			work()
			start := time.Now()
			if err := wc.Send(&wire.Msg{Type: wire.TEnd, Step: k, Targets: targets, DrainMs: drainMs}); err != nil {
				t.Fatal(err)
			}
			for {
				m, err := wc.Recv(10 * time.Second)
				if err != nil {
					t.Fatal(err)
				}
				if m.Type == wire.TEnded {
					return m, time.Since(start)
				}
			}
		}
		var data net.Conn
		step(0, []int64{1}, 0, func() {
			data, err = net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(ok.TCPPort)))
			if err == nil {
				_, err = data.Write(flowopHeader(runID))
			}
			if err != nil {
				t.Fatal(err)
			}
		})
		// three messages arrive; the client claims five, as if two were still in flight
		ended, took := step(1, []int64{5}, drain.Milliseconds(), func() {
			if _, err := data.Write(make([]byte, 3*msg)); err != nil {
				t.Fatal(err)
			}
		})
		txn := ended.Stats.Txns[0]
		if drain > 0 {
			if txn.Errors != 0 || txn.ShortPasses != 2 || txn.CutStrands != 1 || txn.Passes != 3 || took > drain+time.Second {
				t.Fatalf("drain %v: %+v after %v", drain, txn, took)
			}
		} else if txn.Errors == 0 || took < srv.StepGrace {
			t.Fatalf("no drain: the short step did not fail after the step grace: %+v after %v", txn, took)
		}
		close(hbStop)
		data.Close()
		_ = wc.Send(&wire.Msg{Type: wire.TAbort})
		nc.Close()
	}
}

// flowopHeader introduces a data connection of strand 0, connection 0.
func flowopHeader(runID uint32) []byte {
	return dataconn.Header{RunID: runID}.Encode()
}

// Only the reading side of a stream (a timed, unpaced transaction that only
// reads, from one connection) gets a streaming receiver.
func TestStreamConnIsTheReceivingSideOfAStream(t *testing.T) {
	a, b := &dataconn.Conn{}, &dataconn.Conn{}
	s := &strand{conns: []*dataconn.Conn{a, b}}
	timed := &profile.Transaction{Duration: time.Second}
	counted := &profile.Transaction{Iterations: 10}
	read := func(ci int) op { return op{typ: profile.OpRead, ci: ci} }
	cases := []struct {
		name string
		pt   ptxn
		pace time.Duration
		want *dataconn.Conn
	}{
		{"timed reads on one connection", ptxn{t: timed, ops: []op{read(1), read(1)}}, 0, b},
		{"paced", ptxn{t: timed, ops: []op{read(0)}}, time.Millisecond, nil},
		{"counted", ptxn{t: counted, ops: []op{read(0)}}, 0, nil},
		{"read then write", ptxn{t: timed, ops: []op{read(0), {typ: profile.OpWrite, ci: 0}}}, 0, nil},
		{"read then think", ptxn{t: timed, ops: []op{read(0), {typ: profile.OpThink}}}, 0, nil},
		{"two connections", ptxn{t: timed, ops: []op{read(0), read(1)}}, 0, nil},
		{"nothing here", ptxn{t: timed}, 0, nil},
	}
	for _, c := range cases {
		if got := s.streamConn(&c.pt, c.pace); got != c.want {
			t.Errorf("%s: %p, want %p", c.name, got, c.want)
		}
	}
}
