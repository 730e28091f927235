package engine

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"kvmtune/netload/internal/profile"
	"kvmtune/netload/internal/wire"
)

// serverLog collects one server's log lines.
type serverLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *serverLog) logf(format string, a ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf(format, a...))
}

func (l *serverLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// waitFor waits until the log has a line containing s.
func (l *serverLog) waitFor(t *testing.T, s string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(l.String(), s) {
		if time.Now().After(deadline) {
			t.Fatalf("no %q in the server's log:\n%s", s, l)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func twoHostProfile(t *testing.T, h1, h2 string) *profile.Profile {
	t.Helper()
	src, err := os.ReadFile("../../testdata/one-strand-two-hosts.xml")
	if err != nil {
		t.Fatal(err)
	}
	p, err := profile.Parse(src, "one-strand-two-hosts.xml", profile.MapLookup(map[string]string{"h1": h1, "h2": h2}, nil))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// One strand talks to two servers (127.0.0.1 and 127.0.0.2): each server
// mirrors only the ops on its own connections, reaches the client's counts
// and ends every step and the run cleanly.
func TestOneStrandTalksToTwoHosts(t *testing.T) {
	var log1, log2 serverLog
	_, a1 := startServerAt(t, "127.0.0.1:0", log1.logf)
	_, a2 := startServerAt(t, "127.0.0.2:0", log2.logf)
	p := twoHostProfile(t, a1, a2)
	doc, err := run(t, "", p, func(c *RunConfig) { c.Remotes = []Remote{{a1, a1}, {a2, a2}} })
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	// per strand and pass: conn 0 (host 1) writes 100 and reads 20, conn 1
	// (host 2) writes 50 and reads 300; then 30 writes of 1 KiB to host 1
	const strands = 2
	want1 := int64(strands * (100*(100+20) + 30*1024))
	want2 := int64(strands * 100 * (50 + 300))
	s := doc.Summary
	if s.Bytes != want1+want2 || s.ServerBytes != want1+want2 || s.Errors != 0 || s.ServerErrors != 0 || s.Transactions != strands*130 {
		t.Fatalf("summary %+v", s)
	}
	if len(doc.Servers) != 2 {
		t.Fatalf("servers %+v", doc.Servers)
	}
	for i, c := range []struct {
		name       string
		bytes, ops int64
	}{{a1, want1, strands * (2*100 + 30)}, {a2, want2, strands * 2 * 100}} {
		sv := doc.Servers[i]
		if sv.Remotehost != c.name || sv.Remote != c.name || sv.Bytes != c.bytes || sv.Operations != c.ops || sv.Errors != 0 || sv.Host == nil || sv.PeakRSSBytes == 0 {
			t.Errorf("server %d: %+v, want %s with %d bytes in %d ops", i, sv, c.name, c.bytes, c.ops)
		}
	}
	// step 2: every flowop slot counted once, by the host that runs it
	st := doc.Steps[1].Txns[0]
	if st.Server == nil || st.Server.Passes != strands*100 || len(st.Server.Flowops) != 4 {
		t.Fatalf("step 2 server row %+v", st.Server)
	}
	for i, f := range st.Server.Flowops {
		if f.Count != strands*100 {
			t.Errorf("step 2 flowop %d (%s): %d on the servers, want %d", i, f.Type, f.Count, strands*100)
		}
	}
	// step 3 is host 1's only: host 2's strands sat it out
	if st3 := doc.Steps[2].Txns[0]; st3.Server == nil || st3.Server.Passes != strands*30 || st3.Server.BytesRead != strands*30*1024 {
		t.Fatalf("step 3 server row %+v", st3.Server)
	}
	for _, l := range []*serverLog{&log1, &log2} {
		l.waitFor(t, "run finished")
		if out := l.String(); strings.Contains(out, "refused") || strings.Contains(out, "lost") || strings.Contains(out, "reached") {
			t.Errorf("server log:\n%s", out)
		}
	}
}

// A timed step with a UDP stream from the second host (uperf's two-hosts.xml:
// write on conn 0 to $h1, read conn 1 over UDP from $h2) ends cleanly on
// both: the UDP writer is ahead of the client, the TCP reader reaches its count.
func TestTimedTwoHostStepEndsCleanly(t *testing.T) {
	var log1, log2 serverLog
	_, a1 := startServerAt(t, "127.0.0.1:0", log1.logf)
	_, a2 := startServerAt(t, "127.0.0.2:0", log2.logf)
	src := `<profile name="two-hosts"><group nthreads="2">
  <transaction><flowop type="connect" options="remotehost=$h1 protocol=tcp"/><flowop type="connect" options="conn=1 remotehost=$h2 protocol=udp"/></transaction>
  <transaction duration="300ms"><flowop type="write" options="size=300"/><flowop type="read" options="conn=1 size=300"/></transaction>
  <transaction><flowop type="disconnect"/><flowop type="disconnect" options="conn=1"/></transaction>
</group></profile>`
	p, err := profile.Parse([]byte(src), "two-hosts.xml", profile.MapLookup(map[string]string{"h1": a1, "h2": a2}, nil))
	if err != nil {
		t.Fatal(err)
	}
	doc, err := run(t, "", p, func(c *RunConfig) { c.Remotes = []Remote{{a1, a1}, {a2, a2}} })
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	txns := doc.Summary.Transactions
	if txns == 0 || doc.Summary.Errors != 0 || doc.Summary.ServerErrors != 0 {
		t.Fatalf("summary %+v", doc.Summary)
	}
	// host 1 read what the client counted, plus at most one message per user: a pass the client cut at
	// the end of the measured time (waiting for host 2's datagram) had already written to host 1; host 2
	// wrote at least what the client read
	if sv := doc.Servers[0]; sv.Bytes < 300*txns || sv.Bytes > 300*(txns+2) {
		t.Errorf("host 1 moved %d bytes, want %d to %d", sv.Bytes, 300*txns, 300*(txns+2))
	}
	if sv := doc.Servers[1]; sv.Bytes < 300*txns {
		t.Errorf("host 2 wrote %d bytes, fewer than the client read (%d)", sv.Bytes, 300*txns)
	}
	for _, l := range []*serverLog{&log1, &log2} {
		l.waitFor(t, "run finished")
	}
}

// A host that refuses or cannot be reached ends the run with one line that
// names it, and a server that had accepted is told the run is off.
func TestUnreachableOrRefusingHost(t *testing.T) {
	var log1 serverLog
	_, a1 := startServerAt(t, "127.0.0.1:0", log1.logf)
	closed := freeAddr(t)
	p := twoHostProfile(t, a1, closed)
	_, err := run(t, "", p, func(c *RunConfig) { c.Remotes = []Remote{{a1, a1}, {closed, closed}} })
	var re *RunError
	if !errors.As(err, &re) || re.Class != ClassConnect || !strings.Contains(err.Error(), "remotehost "+closed) || strings.Contains(err.Error(), "\n") {
		t.Fatalf("unreachable host: %v", err)
	}

	srv2, a2 := startServerAt(t, "127.0.0.2:0", nil)
	srv2.Token = "secret"
	p = twoHostProfile(t, a1, a2)
	_, err = run(t, "", p, func(c *RunConfig) { c.Remotes = []Remote{{a1, a1}, {a2, a2}} })
	if !errors.As(err, &re) || re.Class != ClassSetup || !strings.Contains(err.Error(), "remotehost "+a2) || !strings.Contains(err.Error(), "needs a token") {
		t.Fatalf("refusing host: %v", err)
	}
	// host 1 accepted the run and was told it is off: it must not wait for a
	// client that is gone, and it serves the next run
	log1.waitFor(t, "called the run off")
	one := withIterations(builtin(t, "rr1c-1x1", 1, nil), 10)
	if _, err := run(t, a1, one, nil); err != nil {
		t.Fatalf("host 1 after the refused run: %v", err)
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	srv, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := srv.Addr().String()
	srv.Close()
	return addr
}

// helloVersion is the version of the hello a run sends to a fake server.
func helloVersion(t *testing.T, p *profile.Profile, remotes func(addr string) []Remote) []int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan int, 4)
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			wc := wire.NewConn(nc)
			if m, err := wc.Recv(5 * time.Second); err == nil {
				got <- m.Version
			}
			wc.Send(&wire.Msg{Type: wire.TError, Error: "no"})
			wc.Close()
		}
	}()
	addr := ln.Addr().String()
	run(t, addr, p, func(c *RunConfig) { c.Remotes = remotes(addr) })
	close(got)
	var out []int
	for v := range got {
		out = append(out, v)
	}
	return out
}

// A one-host run still says version 1, so that an older server serves it; a
// multi-host run's hello says 2 and an older server refuses it rather than
// run ops that are not its own. A server takes 1 and 2, nothing else.
func TestControlVersions(t *testing.T) {
	one := withIterations(builtin(t, "rr1c-1x1", 1, nil), 1)
	if v := helloVersion(t, one, func(string) []Remote { return nil }); len(v) != 1 || v[0] != 1 {
		t.Fatalf("one host: versions %v", v)
	}
	// the fake server refuses the first hello, so only that one is seen
	two := twoHostProfile(t, "x", "y")
	if v := helloVersion(t, two, func(a string) []Remote { return []Remote{{"x", a}, {"y", a}} }); len(v) != 1 || v[0] != 2 {
		t.Fatalf("two hosts: versions %v", v)
	}
	_, addr := startServer(t)
	for _, c := range []struct {
		version int
		ok      bool
	}{{0, false}, {1, true}, {2, true}, {3, false}} {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		wc := wire.NewConn(nc)
		wc.Send(&wire.Msg{Type: wire.THello, Magic: wire.Magic, Version: c.version, RunID: 3, Profile: one})
		m, err := wc.Recv(5 * time.Second)
		if err != nil || (m.Type == wire.THelloOK) != c.ok {
			t.Errorf("version %d: %v %+v", c.version, err, m)
		}
		if m != nil && !c.ok && !strings.Contains(m.Error, "speaks 1 to 2") {
			t.Errorf("version %d refused with %q", c.version, m.Error)
		}
		wc.Send(&wire.Msg{Type: wire.TAbort})
		wc.Close()
	}
}

// A server builds nothing for the other hosts' connections: no listener, no
// UDP endpoint, no op in its strands (two servers on one machine would
// otherwise both bind a fixed port=), and no GOMAXPROCS share for a strand
// that never touches it.
func TestServerLeavesOtherHostsOpsOut(t *testing.T) {
	src := `<profile name="v">
  <group nthreads="2">
    <transaction><flowop type="connect" options="remotehost=$h1"/><flowop type="connect" options="conn=1 remotehost=$h2 protocol=udp"/><flowop type="connect" options="conn=2 remotehost=$h2 port=20999"/></transaction>
    <transaction iterations="5"><flowop type="write" options="size=10"/><flowop type="read" options="conn=1 size=20"/><flowop type="write" options="conn=2 size=30"/></transaction>
  </group>
  <group nthreads="3"><transaction><flowop type="connect" options="conn=3 remotehost=$h2"/></transaction></group>
</profile>`
	p, err := profile.Parse([]byte(src), "v.xml", profile.MapLookup(map[string]string{"h1": "a", "h2": "b"}, nil))
	if err != nil {
		t.Fatal(err)
	}
	sd := newSide("server", p.ServerView(p.RemoteHosts(), 0).Opposite(), 1, nil)
	defer sd.close()
	if err := sd.setupListeners([]string{"127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	if len(sd.udp) != 0 || len(sd.listeners) != 1 || sd.peers[0].acceptors[0] == nil || sd.peers[0].acceptors[20999] != nil {
		t.Fatalf("host a's server opened udp %v, listeners %v", sd.udp, sd.peers[0].acceptors)
	}
	s := sd.strands[0]
	if ops := s.txns[1].ops; len(ops) != 1 || ops[0].typ != profile.OpRead || ops[0].fi != 0 {
		t.Fatalf("strand 0 step 2 ops %+v", ops)
	}
	if got := sd.activeStrands(); got != 2 {
		t.Fatalf("%d active strands on host a, want 2 (group 2 talks only to b)", got)
	}
	if !sd.strands[2].txns[0].idle() {
		t.Fatal("group 2 is host b's only")
	}
}
