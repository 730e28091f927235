// Package wire is netload's control protocol: one TCP connection from the
// controller ("run") to the serving side ("serve"), carrying one JSON
// object per line. The controller sends hello, then begin/end for every
// transaction step, then bye; the server answers hello_ok, ended for each
// step and bye. Both sides send hb (heartbeat) every second, so a side
// that stops hearing from its peer knows it died or hangs. A profile that
// names several remote hosts has one such connection per host's server,
// driven in step by the one controller (see engine.Run); abort calls a run
// off after hello_ok when another host refused it.
package wire

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"kvmtune/netload/internal/profile"
	"kvmtune/netload/internal/sysstat"
)

// Magic and Version identify the protocol. A server accepts MinVersion to
// Version and refuses others. Version 2 adds flowops marked "elsewhere" (a
// multi-host run: ops on another host's connection, which this server
// leaves out); a controller sends it only with such a profile, so a
// single-host run still works against a version-1 server, and a version-1
// server refuses a multi-host run instead of running ops that are not its own.
const (
	Magic      = "netload-control"
	Version    = 2
	MinVersion = 1
)

// Message types.
const (
	THello   = "hello"
	THelloOK = "hello_ok"
	TBegin   = "begin"
	TEnd     = "end"
	TEnded   = "ended"
	TError   = "error"
	THB      = "hb"
	TBye     = "bye"
	TAbort   = "abort"
)

// Msg is every control message; fields unused by a type stay empty.
type Msg struct {
	Type string `json:"type"`

	// hello
	Magic    string           `json:"magic,omitempty"`
	Version  int              `json:"version,omitempty"`
	RunID    uint32           `json:"run_id,omitempty"`
	Token    string           `json:"token,omitempty"` // the server's shared secret, when it has one
	Profile  *profile.Profile `json:"profile,omitempty"`
	NeedFDs  int              `json:"need_fds,omitempty"`
	IOMode   string           `json:"io_mode,omitempty"`
	TCPPort  int              `json:"tcp_port,omitempty"`  // sender's default data listener
	UDPPorts []UDPPort        `json:"udp_ports,omitempty"` // sender's UDP endpoints
	Host     *HostInfo        `json:"host,omitempty"`
	Step     int              `json:"step,omitempty"`
	Targets  []int64          `json:"targets,omitempty"` // end: passes done per strand
	// end of a timed step: how long the server may take to receive what is
	// still in flight on connections that are only closed afterwards
	// (0: as long as its step grace, then fail, as before)
	DrainMs    int64      `json:"drain_ms,omitempty"`
	Stats      *SideStats `json:"stats,omitempty"`
	Error      string     `json:"error,omitempty"`
	ErrorClass string     `json:"error_class,omitempty"`
}

// UDPPort maps one strand's UDP connection to its bound port.
type UDPPort struct {
	Strand int `json:"strand"`
	Conn   int `json:"conn"`
	Port   int `json:"port"`
}

// HostInfo describes a side.
type HostInfo struct {
	Hostname string `json:"hostname"`
	PID      int    `json:"pid"`
	NCPU     int    `json:"ncpu"`
	Version  string `json:"version"`
	Kernel   string `json:"kernel,omitempty"`
}

// FlowopStats counts one flowop position of a transaction.
type FlowopStats struct {
	Type  string  `json:"type"`
	Count uint64  `json:"count"`
	SumNs float64 `json:"sum_ns"`
	MinNs uint64  `json:"min_ns"`
	MaxNs uint64  `json:"max_ns"`
}

// Add merges o into f.
func (f *FlowopStats) Add(o FlowopStats) {
	if o.Count == 0 {
		return
	}
	if f.Count == 0 || o.MinNs < f.MinNs {
		f.MinNs = o.MinNs
	}
	if o.MaxNs > f.MaxNs {
		f.MaxNs = o.MaxNs
	}
	f.Count += o.Count
	f.SumNs += o.SumNs
	if f.Type == "" {
		f.Type = o.Type
	}
}

// TxnStats is what one side measured for one group's transaction in a step.
type TxnStats struct {
	Group        int           `json:"group"`
	Strands      int           `json:"strands"`
	ElapsedNs    int64         `json:"elapsed_ns"`
	BytesRead    int64         `json:"bytes_read"`
	BytesWritten int64         `json:"bytes_written"`
	Ops          int64         `json:"ops"`
	Passes       int64         `json:"passes"`
	Errors       int64         `json:"errors"`
	FirstError   string        `json:"first_error,omitempty"`
	Flowops      []FlowopStats `json:"flowops"`
	// TCP segments retransmitted on the group's data connections (TCP_INFO)
	Retransmits int64 `json:"retransmits,omitempty"`
	// controller: strands whose operation in progress was cut when the
	// timed transaction ended; server: strands still short of the
	// controller's count when the drain time was up
	CutStrands int64 `json:"cut_strands,omitempty"`
	// server: messages (passes) the controller completed that had not
	// arrived when the drain time was up; still in flight, not lost
	ShortPasses int64 `json:"short_passes,omitempty"`
}

// SideStats is one side's account of a step.
type SideStats struct {
	Step    int         `json:"step"`
	Txns    []TxnStats  `json:"txns"`
	CPU     sysstat.CPU `json:"cpu"`
	PeakRSS int64       `json:"peak_rss_bytes"`
}

// Conn is a control connection: a line-delimited JSON codec safe for one
// reader and many writers.
type Conn struct {
	// MaxLine bounds one received message (a server lowers it to its
	// profile-size limit before reading a hello).
	MaxLine int
	nc      net.Conn
	r       *bufio.Reader
	wmu     sync.Mutex
	enc     *json.Encoder
	bw      *bufio.Writer
}

// MaxLine bounds one control message by default.
const MaxLine = 16 << 20

// NewConn wraps nc.
func NewConn(nc net.Conn) *Conn {
	bw := bufio.NewWriter(nc)
	// a small read buffer: an idle or hostile connection costs little, and
	// longer lines are assembled chunk by chunk up to MaxLine
	return &Conn{MaxLine: MaxLine, nc: nc, r: bufio.NewReaderSize(nc, 4<<10), bw: bw, enc: json.NewEncoder(bw)}
}

// Net returns the underlying connection.
func (c *Conn) Net() net.Conn { return c.nc }

// WriteTimeout bounds one control write, so a hung peer cannot block us.
const WriteTimeout = 5 * time.Second

// Send writes one message.
func (c *Conn) Send(m *Msg) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_ = c.nc.SetWriteDeadline(time.Now().Add(WriteTimeout))
	if err := c.enc.Encode(m); err != nil {
		return fmt.Errorf("control: send %s: %w", m.Type, err)
	}
	if err := c.bw.Flush(); err != nil {
		return fmt.Errorf("control: send %s: %w", m.Type, err)
	}
	return nil
}

// ErrTooLong is returned for an oversized control line.
var ErrTooLong = errors.New("control: message too long")

// Recv reads one message, waiting at most timeout (0 = no limit).
func (c *Conn) Recv(timeout time.Duration) (*Msg, error) {
	if timeout > 0 {
		_ = c.nc.SetReadDeadline(time.Now().Add(timeout))
	} else {
		_ = c.nc.SetReadDeadline(time.Time{})
	}
	var line []byte
	for {
		chunk, isPrefix, err := c.r.ReadLine()
		if err != nil {
			return nil, err
		}
		line = append(line, chunk...)
		if len(line) > c.MaxLine {
			return nil, ErrTooLong
		}
		if !isPrefix {
			break
		}
	}
	return Decode(line)
}

// Decode parses one control line (what a peer sent: untrusted).
func Decode(line []byte) (*Msg, error) {
	m := &Msg{}
	if err := json.Unmarshal(line, m); err != nil {
		return nil, fmt.Errorf("control: bad message: %w", err)
	}
	if m.Type == "" {
		return nil, errors.New("control: message without type")
	}
	return m, nil
}

// Close closes the connection.
func (c *Conn) Close() error { return c.nc.Close() }
