package wire

import (
	"encoding/json"
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

// FuzzDecode: whatever a peer sends, decoding never panics, and a message
// it accepts survives a round trip.
func FuzzDecode(f *testing.F) {
	f.Add([]byte(`{"type":"hello","magic":"netload-control","version":1,"token":"t","profile":{"name":"p","groups":[{"name":"g","strands":1,"transactions":[{"iterations":1,"flowops":[{"type":"connect","count":1,"conn":0,"protocol":"tcp"}]}]}]}}`))
	f.Add([]byte(`{"type":"end","step":2,"targets":[1,2,3]}`))
	f.Add([]byte(`{"type":"ended","stats":{"step":1,"txns":[{"group":0,"flowops":[{"type":"read","count":3}]}]}}`))
	f.Add([]byte(`{"type":""}`))
	f.Fuzz(func(t *testing.T, line []byte) {
		m, err := Decode(line)
		if err != nil {
			return
		}
		if m.Type == "" {
			t.Fatal("accepted a message without a type")
		}
		b, err := json.Marshal(m)
		if err != nil {
			return // e.g. a NaN cannot come back out; the decoder refused nothing
		}
		m2, err := Decode(b)
		if err != nil || m2.Type != m.Type {
			t.Fatalf("round trip: %v (%q -> %q)", err, m.Type, m2.Type)
		}
	})
}
