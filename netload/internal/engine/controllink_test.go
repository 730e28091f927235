package engine

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"kvmtune/netload/internal/profile"
	"kvmtune/netload/internal/wire"
)

func startServerWith(t *testing.T, mod func(*Server)) string {
	t.Helper()
	srv, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv.PeerTimeout, srv.StepGrace = 3*time.Second, 3*time.Second
	mod(srv)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { srv.Serve(ctx); close(done) }()
	t.Cleanup(func() { cancel(); srv.Close(); <-done })
	return srv.Addr().String()
}

func TestTokenRefusesAClientWithoutItBeforeAnyTraffic(t *testing.T) {
	addr := startServerWith(t, func(s *Server) { s.Token = "s3cret" })
	p := withIterations(builtin(t, "rr1c-1x1", 1, nil), 50)
	for _, tok := range []string{"", "wrong"} {
		doc, err := run(t, addr, p, func(c *RunConfig) { c.Token = tok })
		if err == nil || doc.Error == nil || doc.Error.Class != ClassSetup {
			t.Fatalf("token %q: want a setup refusal, got %v", tok, err)
		}
		if strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), "token") {
			t.Errorf("token %q: refusal is not one line naming the token: %q", tok, err)
		}
		if len(doc.Steps) != 0 || doc.Summary.Bytes != 0 {
			t.Errorf("token %q: traffic after a refusal: %d steps, %d bytes", tok, len(doc.Steps), doc.Summary.Bytes)
		}
	}
	doc, err := run(t, addr, p, func(c *RunConfig) { c.Token = "s3cret" })
	if err != nil || doc.Summary.Transactions != 50 {
		t.Fatalf("with the token: %v, %d transactions", err, doc.Summary.Transactions)
	}
}

func TestOversizedHelloIsRefusedInOneLine(t *testing.T) {
	addr := startServerWith(t, func(s *Server) { s.MaxProfileBytes = 2048 })
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	go nc.Write([]byte(`{"type":"hello","magic":"` + strings.Repeat("x", 100000) + "\"}\n"))
	wc := wire.NewConn(nc)
	m, err := wc.Recv(5 * time.Second)
	if err != nil || m.Type != wire.TError || !strings.Contains(m.Error, "larger than this server's limit of 2048") {
		t.Fatalf("got %+v, %v", m, err)
	}
}

// Idle connections beyond MaxPending push the oldest out, so a legitimate
// client still gets served while hundreds of sockets sit silent.
func TestIdleConnectionsDoNotLockOutAClient(t *testing.T) {
	addr := startServerWith(t, func(s *Server) { s.MaxPending = 16; s.HelloTimeout = 30 * time.Second })
	var idle []net.Conn
	defer func() {
		for _, c := range idle {
			c.Close()
		}
	}()
	for i := 0; i < 300; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		idle = append(idle, c)
	}
	// a slowloris: a hello that never ends
	slow, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	slow.Write([]byte(`{"type":"hel`))
	doc, err := run(t, addr, withIterations(builtin(t, "rr1c-1x1", 1, nil), 20), nil)
	if err != nil || doc.Summary.Transactions != 20 {
		t.Fatalf("legitimate client: %v", err)
	}
	// the early idle connections were closed by the server
	idle[0].SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := idle[0].Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("the oldest idle connection is still open: %v", err)
	}
}

func TestSlowHelloIsCutOffAtTheHelloTimeout(t *testing.T) {
	addr := startServerWith(t, func(s *Server) { s.HelloTimeout = 300 * time.Millisecond })
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	for i := 0; i < 20; i++ {
		if _, err := c.Write([]byte("{")); err != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("a trickling hello kept its connection: %v", err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("cut off after %v", el)
	}
}

func TestMaxSessionsRefusesTheNextRun(t *testing.T) {
	addr := startServerWith(t, func(s *Server) { s.MaxSessions = 1 })
	long := builtin(t, "rr1c-1x1", 1, map[string]string{"duration": "1500ms"})
	first := make(chan error, 1)
	go func() {
		_, err := Run(context.Background(), RunConfig{Remote: addr, Profile: long, Test: "a", PeerTimeout: 3 * time.Second})
		first <- err
	}()
	time.Sleep(400 * time.Millisecond)
	_, err := run(t, addr, withIterations(builtin(t, "rr1c-1x1", 1, nil), 5), nil)
	if err == nil || !strings.Contains(err.Error(), "busy") {
		t.Fatalf("second run: want busy, got %v", err)
	}
	if err := <-first; err != nil {
		t.Fatalf("first run: %v", err)
	}
	if _, err := run(t, addr, withIterations(builtin(t, "rr1c-1x1", 1, nil), 5), nil); err != nil {
		t.Fatalf("after the first run ended: %v", err)
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// Lost datagrams leave UDP readers short of the client's count: the server
// takes that as loss; a short TCP reader is still an error.
func TestOnlyUDPReadersShort(t *testing.T) {
	src := `<profile name="u"><group nthreads="2">
  <transaction><flowop type="connect" options="conn=1 remotehost=h protocol=udp"/><flowop type="connect" options="conn=2 remotehost=h"/></transaction>
  <transaction duration="1s"><flowop type="write" options="conn=1 size=64"/></transaction>
  <transaction duration="1s"><flowop type="write" options="conn=2 size=64"/></transaction>
</group></profile>`
	p, err := profile.Parse([]byte(src), "u.xml", nil)
	if err != nil {
		t.Fatal(err)
	}
	sd := newSide("server", p.Opposite(), 1, nil)
	defer sd.close()
	for _, c := range []struct {
		step int
		want bool
	}{{1, true}, {2, false}} {
		rs := &runningStep{k: c.step, ctl: &stepCtl{targets: []int64{5, 5}}}
		sd.strands[0].stepPasses.Store(5)
		sd.strands[1].stepPasses.Store(3)
		if got := sd.onlyUDPReadersShort(rs); got != c.want {
			t.Errorf("step %d: %v, want %v", c.step, got, c.want)
		}
	}
}
