// Package profile reads uperf XML profiles into a validated, fully
// resolved model: every $VAR expanded, every size and time converted,
// every flowop bound to a named connection.
package profile

import (
	"fmt"
	"strings"
	"time"
)

// Op is a flowop type.
type Op string

// The flowop types netload executes.
const (
	OpAccept     Op = "accept"
	OpConnect    Op = "connect"
	OpRead       Op = "read"
	OpWrite      Op = "write"
	OpDisconnect Op = "disconnect"
	OpThink      Op = "think"
	OpNop        Op = "nop"
)

// Pos is a 1-based line and column (columns count characters).
type Pos struct {
	Line int `json:"line"`
	Col  int `json:"col"`
}

func (p Pos) String() string { return fmt.Sprintf("%d:%d", p.Line, p.Col) }

// Profile is a parsed profile.
type Profile struct {
	Name   string  `json:"name"`
	Groups []Group `json:"groups"`
	// Warnings are options uperf accepts and netload ignores, as uperf
	// does; each is said once. They are not sent to the server.
	Warnings []string `json:"-"`
}

// Group is a set of identical strands (users).
type Group struct {
	Name string `json:"name"`
	// Strands is nthreads or nprocs; netload runs every strand as a goroutine.
	Strands      int           `json:"strands"`
	Procs        bool          `json:"procs,omitempty"` // declared with nprocs
	Transactions []Transaction `json:"transactions"`
	Pos          Pos           `json:"pos"`
}

// Transaction is a list of flowops run Iterations times, or repeatedly for
// Duration, optionally paced at Rate executions per second per strand.
type Transaction struct {
	Iterations int64         `json:"iterations,omitempty"`
	Duration   time.Duration `json:"duration,omitempty"`
	Rate       float64       `json:"rate,omitempty"`
	Flowops    []Flowop      `json:"flowops"`
	Pos        Pos           `json:"pos"`
}

// Timed reports whether the transaction runs for a duration.
func (t *Transaction) Timed() bool { return t.Duration > 0 }

// Setup reports whether the transaction only opens or closes connections
// (or does nothing): such transactions are not part of the measured phase
// when a profile has no timed transaction.
func (t *Transaction) Setup() bool {
	for _, f := range t.Flowops {
		if s := f.Type.spec(); s == nil || !s.Setup {
			return false
		}
	}
	return true
}

// Flowop is one operation with its options resolved.
type Flowop struct {
	Type  Op    `json:"type"`
	Size  int64 `json:"size,omitempty"`  // bytes per read/write
	RSize int64 `json:"rsize,omitempty"` // bytes the peer uses for its opposite op (0 = Size)
	// LastSize, when set, is the size of the Count-th (last) execution: the
	// serving side of a TCP op with rsize moves the same bytes per pass as
	// the controller, in rsize pieces (see Opposite).
	LastSize   int64         `json:"last_size,omitempty"`
	Count      int64         `json:"count"` // executions per transaction pass
	Conn       int           `json:"conn"`  // connection id within the strand
	RemoteHost string        `json:"remotehost,omitempty"`
	Port       int           `json:"port,omitempty"`
	Protocol   string        `json:"protocol,omitempty"` // tcp or udp (connect/accept)
	NoDelay    bool          `json:"tcp_nodelay,omitempty"`
	WndSz      int64         `json:"wndsz,omitempty"`
	CC         string        `json:"cc,omitempty"`       // TCP congestion control (TCP_CONGESTION)
	Duration   time.Duration `json:"duration,omitempty"` // think time
	Busy       bool          `json:"busy,omitempty"`     // think by spinning
	CanFail    bool          `json:"canfail,omitempty"`
	Timeout    time.Duration `json:"timeout,omitempty"` // per-operation timeout
	Pos        Pos           `json:"pos"`
}

// PeerSize is the size the opposite side uses.
func (f *Flowop) PeerSize() int64 {
	if f.RSize > 0 {
		return f.RSize
	}
	return f.Size
}

// Opposite returns the profile the serving side runs: every op swapped
// (read<->write, accept<->connect) and sizes exchanged with rsize.
func (p *Profile) Opposite() *Profile {
	q := &Profile{Name: p.Name}
	for _, g := range p.Groups {
		ng := g
		ng.Transactions = nil
		for _, t := range g.Transactions {
			nt := t
			nt.Flowops = nil
			for _, f := range t.Flowops {
				nf := f
				nf.Type = f.Type.Opposite()
				if f.Type.Moves() {
					nf.Size, nf.RSize = f.PeerSize(), 0
					if f.RSize > 0 {
						nf.RSize = f.Size
					}
					if f.RSize > 0 && f.RSize != f.Size && f.Protocol != "udp" {
						// TCP is a byte stream: like uperf's slave, the peer moves the
						// controller's size*count bytes per pass, in rsize pieces, so
						// that both sides stay in step whatever rsize says
						total := f.Size * f.Count
						nf.Count = (total + f.RSize - 1) / f.RSize
						nf.LastSize = 0
						if last := total - (nf.Count-1)*f.RSize; last != f.RSize {
							nf.LastSize = last
						}
					}
				}
				nt.Flowops = append(nt.Flowops, nf)
			}
			ng.Transactions = append(ng.Transactions, nt)
		}
		q.Groups = append(q.Groups, ng)
	}
	return q
}

// Strands is the total number of strands over all groups.
func (p *Profile) Strands() int {
	n := 0
	for _, g := range p.Groups {
		n += g.Strands
	}
	return n
}

// Steps is the number of transaction steps: step k runs every group's
// k-th transaction (groups with fewer transactions idle).
func (p *Profile) Steps() int {
	n := 0
	for _, g := range p.Groups {
		if len(g.Transactions) > n {
			n = len(g.Transactions)
		}
	}
	return n
}

// ConnsPerStrand is the number of distinct connections a strand of group g
// opens (the file descriptors it needs at once, at most).
func (g *Group) ConnsPerStrand() int {
	seen := map[int]bool{}
	for _, t := range g.Transactions {
		for _, f := range t.Flowops {
			if f.Type == OpConnect || f.Type == OpAccept {
				seen[f.Conn] = true
			}
		}
	}
	return len(seen)
}

// RemoteHosts lists the distinct remotehost values, in order of appearance.
func (p *Profile) RemoteHosts() []string {
	var out []string
	seen := map[string]bool{}
	for _, g := range p.Groups {
		for _, t := range g.Transactions {
			for _, f := range t.Flowops {
				if f.RemoteHost != "" && !seen[f.RemoteHost] {
					seen[f.RemoteHost] = true
					out = append(out, f.RemoteHost)
				}
			}
		}
	}
	return out
}

// Describe gives a one-line summary of a transaction, e.g. "write 200 B, read 1000 B".
func (t *Transaction) Describe() string {
	var parts []string
	for _, f := range t.Flowops {
		s := string(f.Type)
		switch {
		case f.Type.Moves():
			s += fmt.Sprintf(" %d B", f.Size)
		case f.Type == OpThink:
			s += " " + f.Duration.String()
		}
		if f.Count > 1 {
			s += fmt.Sprintf(" x%d", f.Count)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ")
}

// BytesPerPass is the payload one pass of the transaction reads and writes
// on this side.
func (t *Transaction) BytesPerPass() (read, written int64) {
	for _, f := range t.Flowops {
		switch f.Type {
		case OpRead:
			read += f.Size * f.Count
		case OpWrite:
			written += f.Size * f.Count
		}
	}
	return
}

// SplitByHost gives each remote host the groups that talk to it, for a
// profile that names several (uperf's two-hosts, VoIP, netBackup, SpecWeb):
// netload runs one server per host. A group that names no host goes with
// the first one; a group that names two cannot be split.
func (p *Profile) SplitByHost() ([]string, map[string]*Profile, error) {
	hosts := p.RemoteHosts()
	out := map[string]*Profile{}
	for _, g := range p.Groups {
		mine := ""
		for _, t := range g.Transactions {
			for _, f := range t.Flowops {
				if f.RemoteHost == "" || f.RemoteHost == mine {
					continue
				}
				if mine != "" {
					return nil, nil, fmt.Errorf("group %q talks to %s and %s; netload runs one server per host and a group's strands talk to one of them", g.Name, mine, f.RemoteHost)
				}
				mine = f.RemoteHost
			}
		}
		if mine == "" && len(hosts) > 0 {
			mine = hosts[0]
		}
		sub := out[mine]
		if sub == nil {
			sub = &Profile{Name: p.Name}
			out[mine] = sub
		}
		sub.Groups = append(sub.Groups, g)
	}
	return hosts, out, nil
}
