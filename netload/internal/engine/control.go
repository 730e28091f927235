package engine

import (
	"sync"
	"time"

	"kvmtune/netload/internal/wire"
)

// controlLink keeps one side's control connection alive while a run goes on:
// a reader forwards every message but heartbeats, and reports an error when
// the peer stays silent past the timeout (so a dead or hung peer ends the run);
// a writer sends a heartbeat every second so the peer can tell the same of us.
type controlLink struct {
	msgs    chan *wire.Msg
	readErr chan error
	stop    chan struct{}
	wg      sync.WaitGroup
	wc      *wire.Conn
}

func startControlLink(wc *wire.Conn, peerTimeout time.Duration) *controlLink {
	c := &controlLink{
		msgs:    make(chan *wire.Msg, 16),
		readErr: make(chan error, 1),
		stop:    make(chan struct{}),
		wc:      wc,
	}
	c.wg.Add(2)
	go c.read(peerTimeout)
	go c.heartbeat()
	return c
}

func (c *controlLink) read(peerTimeout time.Duration) {
	defer c.wg.Done()
	for {
		m, err := c.wc.Recv(peerTimeout)
		if err != nil {
			c.readErr <- err
			return
		}
		if m.Type == wire.THB {
			continue
		}
		select {
		case c.msgs <- m:
		case <-c.stop:
			return
		}
	}
}

func (c *controlLink) heartbeat() {
	defer c.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			_ = c.wc.Send(&wire.Msg{Type: wire.THB})
		case <-c.stop:
			return
		}
	}
}

// close stops both goroutines and closes the connection (which unblocks the reader).
func (c *controlLink) close() {
	close(c.stop)
	c.wc.Close()
	c.wg.Wait()
}
