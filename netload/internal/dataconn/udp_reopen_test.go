package dataconn

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"
)

// A UDP connection can be closed and accepted again on the same endpoint.
func TestUDPReopen(t *testing.T) {
	ep, err := ListenUDP("127.0.0.1", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(ep.Port()))
	h := Header{RunID: 1, Strand: 0, Conn: 0}
	o := Options{Protocol: "udp"}
	for i := 0; i < 3; i++ {
		done := make(chan *Conn, 1)
		go func() {
			c, err := ep.Accept(h, o, nil, 3*time.Second)
			if err != nil {
				t.Errorf("round %d: %v", i, err)
			}
			done <- c
		}()
		cc, err := Dial(context.Background(), addr, h, o)
		if err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
		sc := <-done
		if _, err := cc.Write([]byte("hello")); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 5)
		if n, err := sc.Read(buf); err != nil || n != 5 {
			t.Fatalf("round %d: %d %v", i, n, err)
		}
		cc.Close()
		sc.Close()
	}
}
