package engine

import (
	"context"
	"net"
	"testing"
	"time"

	"kvmtune/netload/internal/wire"
)

var helloSeeds = [][]byte{
	[]byte(`{"type":"hello","magic":"netload-control","version":1,"run_id":7,"profile":{"name":"p","groups":[{"name":"g","strands":1,"transactions":[{"iterations":1,"flowops":[{"type":"connect","count":1,"conn":0,"protocol":"tcp"}]},{"iterations":3,"flowops":[{"type":"write","size":10,"count":1,"conn":0},{"type":"read","size":5,"count":1,"conn":0}]}]}]}}`),
	[]byte(`{"type":"hello","magic":"netload-control","version":1,"profile":{"name":"p","groups":[{"name":"g","strands":2,"transactions":[{"iterations":1,"flowops":[{"type":"accept","count":1,"conn":1,"protocol":"udp","port":70000}]}]}]}}`),
	[]byte(`{"type":"hello","magic":"netload-control","version":1,"profile":{"name":"p","groups":[{"name":"g","strands":100000,"transactions":[{"iterations":1,"flowops":[{"type":"read","size":1073741824,"count":1,"conn":0}]}]}]}}`),
	[]byte(`{"type":"hello","magic":"netload-control","version":2,"run_id":9,"profile":{"name":"p","groups":[{"name":"g","strands":1,"transactions":[{"iterations":1,"flowops":[{"type":"connect","count":1,"conn":0,"protocol":"tcp","elsewhere":true},{"type":"connect","count":1,"conn":1,"protocol":"tcp"}]},{"iterations":3,"flowops":[{"type":"write","size":10,"count":1,"conn":0,"elsewhere":true}]}]}]}}`),
	[]byte(`{"type":"begin","step":3}`),
}

// FuzzHelloProfile: a profile a client sends is checked before the server
// builds anything from it; whatever passes the check can be built.
func FuzzHelloProfile(f *testing.F) {
	for _, s := range helloSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		m, err := wire.Decode(line)
		if err != nil || m.Profile == nil {
			return
		}
		if checkProfile(m.Profile) != nil {
			return
		}
		sprof := m.Profile.Opposite()
		// valid, but too big to build once per fuzz input: a side of 64 MiB
		// and 2,000 strands took long enough that, on a loaded 2-core CI
		// machine, a worker was still building one when -fuzztime ran out,
		// and go test reported "context deadline exceeded" as a failure.
		// Building is the same code at any size.
		if bufferBytes(sprof) > 4<<20 || sprof.Strands() > 64 {
			return
		}
		sd := newSide("server", sprof, m.RunID, nil)
		sd.close()
	})
}

// FuzzServerControl sends arbitrary bytes to a real `serve` on loopback: it
// must answer or hang up, never crash, and keep serving.
func FuzzServerControl(f *testing.F) {
	for _, s := range helloSeeds {
		f.Add(append(s, '\n'))
	}
	f.Add([]byte("GET / HTTP/1.0\r\n\r\n"))
	srv, err := Listen("127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	srv.HelloTimeout, srv.PeerTimeout, srv.StepGrace = 200*time.Millisecond, 300*time.Millisecond, 300*time.Millisecond
	srv.MaxProfileBytes = 64 << 10
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { srv.Serve(ctx); close(done) }()
	f.Cleanup(func() { cancel(); srv.Close(); <-done })
	addr := srv.Addr().String()
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("the server stopped accepting: %v", err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(time.Second))
		c.Write(data)
		c.(*net.TCPConn).CloseWrite()
		buf := make([]byte, 4096)
		for {
			if _, err := c.Read(buf); err != nil {
				return
			}
		}
	})
}
