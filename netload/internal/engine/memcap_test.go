package engine

import (
	"fmt"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"kvmtune/netload/internal/profile"
	"kvmtune/netload/internal/wire"
)

// memProfile is a profile of users strands that each write one message of
// size (uperf units) on their own connection.
func memProfile(t *testing.T, users int, size string) *profile.Profile {
	t.Helper()
	xml := fmt.Sprintf(`<profile name="mem"><group nthreads="%d">
  <transaction iterations="1"><flowop type="connect" options="remotehost=127.0.0.1"/></transaction>
  <transaction iterations="1"><flowop type="write" options="size=%s"/></transaction>
  <transaction iterations="1"><flowop type="disconnect"/></transaction>
</group></profile>`, users, size)
	p, err := profile.Parse([]byte(xml), "mem.xml", nil)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// hello sends p's hello to the server at addr by hand (no client side is
// built here, so the test process holds only the server's memory) and
// returns the answer and the open control connection.
func hello(t *testing.T, addr string, p *profile.Profile) (*wire.Msg, *wire.Conn) {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	wc := wire.NewConn(nc)
	t.Cleanup(func() { wc.Close() })
	if err := wc.Send(&wire.Msg{Type: wire.THello, Magic: wire.Magic, Version: wire.Version, RunID: 1, Profile: p}); err != nil {
		t.Fatal(err)
	}
	m, err := wc.Recv(5 * time.Second)
	if err != nil {
		t.Fatalf("no answer to the hello: %v", err)
	}
	return m, wc
}

// A hello asking for 1 GiB of buffers is refused with one clear line, which
// the server also logs, and no run starts.
func TestHelloAskingForAGibibyteIsRefused(t *testing.T) {
	log := &serverLog{}
	addr := startServerWith(t, func(s *Server) { s.Logf = log.logf })
	m, _ := hello(t, addr, memProfile(t, 1, "1g"))
	if m.Type != wire.TError || m.ErrorClass != ClassSetup || strings.Contains(m.Error, "\n") ||
		!strings.Contains(m.Error, "more than its limit of 256.0 MiB per run (serve --max-run-memory)") {
		t.Fatalf("want a one-line refusal naming the limit, got %s %q", m.Type, m.Error)
	}
	if !strings.Contains(log.String(), "refused: the run would hold 1024.0 MiB") {
		t.Fatalf("the refusal is not in the server's log:\n%s", log)
	}
	// 100,000 strands of one byte hold their stacks and statistics, not buffers
	m, _ = hello(t, addr, memProfile(t, 100000, "1"))
	if m.Type != wire.TError || !strings.Contains(m.Error, "100000 strands") {
		t.Fatalf("100,000 strands: want a refusal, got %s %q", m.Type, m.Error)
	}
}

// Runs served at once share MaxMemory: a run that would pass it is refused
// as busy, and the memory of a run that ended is free again.
func TestRunsServedAtOnceShareTheMemoryCap(t *testing.T) {
	addr := startServerWith(t, func(s *Server) { s.MaxRunMemory, s.MaxMemory = 48<<20, 64<<20 })
	p := memProfile(t, 2, "20m") // 40 MiB + 64 KiB
	m, first := hello(t, addr, p)
	if m.Type != wire.THelloOK {
		t.Fatalf("first run: %s %q", m.Type, m.Error)
	}
	m, _ = hello(t, addr, p)
	if m.Type != wire.TError || !strings.Contains(m.Error, "busy") || !strings.Contains(m.Error, "serve --max-memory") {
		t.Fatalf("second run beyond --max-memory: want busy, got %s %q", m.Type, m.Error)
	}
	first.Close()
	deadline := time.Now().Add(5 * time.Second)
	for {
		m, wc := hello(t, addr, p)
		if m.Type == wire.THelloOK {
			break
		}
		wc.Close()
		if time.Now().After(deadline) {
			t.Fatalf("the first run's memory was not given back: %s %q", m.Type, m.Error)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A hello within the caps is accepted, and accepting it commits no memory:
// the strands' buffers are made when a step first moves data.
func TestAcceptedHelloAllocatesNoBuffers(t *testing.T) {
	addr := startServerWith(t, func(*Server) {})
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	m, _ := hello(t, addr, memProfile(t, 2, "100m")) // 200 MiB of buffers: within 256 MiB
	if m.Type != wire.THelloOK {
		t.Fatalf("a hello within the caps: %s %q", m.Type, m.Error)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if grew := int64(after.HeapInuse) - int64(before.HeapInuse); grew > 8<<20 {
		t.Fatalf("the heap grew by %d MiB at the hello", grew>>20)
	}
}
