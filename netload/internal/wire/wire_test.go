package wire

import (
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"kvmtune/netload/internal/profile"
)

func TestRoundTripAndTimeouts(t *testing.T) {
	a, b := net.Pipe()
	ca, cb := NewConn(a), NewConn(b)
	defer ca.Close()
	defer cb.Close()
	p := &profile.Profile{Name: "x", Groups: []profile.Group{{Name: "g", Strands: 3}}}
	go ca.Send(&Msg{Type: THello, Magic: Magic, Version: Version, Profile: p, Targets: []int64{1, 2, 3}})
	m, err := cb.Recv(time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if m.Type != THello || m.Profile.Groups[0].Strands != 3 || len(m.Targets) != 3 {
		t.Fatalf("%+v", m)
	}
	start := time.Now()
	if _, err := cb.Recv(100 * time.Millisecond); err == nil || time.Since(start) > time.Second {
		t.Fatalf("silent peer: %v after %v", err, time.Since(start))
	}
}

func TestRejectsGarbage(t *testing.T) {
	for _, line := range []string{"not json\n", "{}\n", `{"type":""}` + "\n"} {
		a, b := net.Pipe()
		go func() { a.Write([]byte(line)); a.Close() }()
		if _, err := NewConn(b).Recv(time.Second); err == nil {
			t.Errorf("%q accepted", line)
		}
		b.Close()
	}
	a, b := net.Pipe()
	go func() {
		a.Write([]byte(`{"type":"hb","error":"` + strings.Repeat("x", MaxLine+10)))
		a.Close()
	}()
	if _, err := NewConn(b).Recv(5 * time.Second); !errors.Is(err, ErrTooLong) {
		t.Errorf("oversized line: %v", err)
	}
}
