package dataconn

import (
	"net"
	"testing"
	"time"
)

// A fixed port still held by a previous listener is taken once that listener closes.
func TestListenWaitsForFixedPortRelease(t *testing.T) {
	old, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := old.Addr().(*net.TCPAddr).Port
	go func() {
		time.Sleep(200 * time.Millisecond)
		old.Close()
	}()
	a, err := Listen("127.0.0.1", port, 0, 1, func(error) {})
	if err != nil {
		t.Fatalf("Listen on a port released after 200ms: %v", err)
	}
	defer a.Close()
	if a.Port() != port {
		t.Fatalf("port %d, want %d", a.Port(), port)
	}
}

// A port that stays taken still fails, after the bounded wait.
func TestListenFixedPortStaysTaken(t *testing.T) {
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	start := time.Now()
	_, err = Listen("127.0.0.1", held.Addr().(*net.TCPAddr).Port, 0, 1, func(error) {})
	if err == nil {
		t.Fatal("Listen on a held port succeeded")
	}
	if d := time.Since(start); d < fixedPortWait || d > fixedPortWait+2*time.Second {
		t.Fatalf("gave up after %v, want about %v", d, fixedPortWait)
	}
}
