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
	// Elsewhere is set only in the copy of a multi-host profile that the
	// controller sends to one server (see ServerView): the op runs on a
	// connection to another host, so this server leaves it out.
	Elsewhere bool `json:"elsewhere,omitempty"`
	Pos       Pos  `json:"pos"`
}

// UsesConn reports whether the op works on a connection (and so on the
// host that connection goes to); think and nop do not.
func (f *Flowop) UsesConn() bool {
	s := f.Type.spec()
	return s != nil && (s.Opens || s.Moves || s.Closes)
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
// opens (the file descriptors it needs at once, at most; those on another
// host's connections do not count).
func (g *Group) ConnsPerStrand() int {
	seen := map[int]bool{}
	for _, t := range g.Transactions {
		for _, f := range t.Flowops {
			if (f.Type == OpConnect || f.Type == OpAccept) && !f.Elsewhere {
				seen[f.Conn] = true
			}
		}
	}
	return len(seen)
}

// RemoteHosts lists the distinct remotehost values, in order of appearance.
// Every op on a connection carries its connection's host (the parser binds
// it), so this is the list of servers a run needs.
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

// ServerView is the profile the controller sends to the server of
// hosts[i] when the profile names several hosts (uperf's two-hosts, VoIP,
// netBackup, SpecWeb): a copy in which every op on a connection to another
// host is marked Elsewhere. A strand of any group may talk to several hosts
// (two-hosts.xml writes to $h1 and reads from $h2 in one pass); each server
// mirrors only the ops on its own connections, the way uperf's master turns
// the other hosts' flowops into nops before it sends a slave its group.
// An op on a connection opened without remotehost belongs to hosts[0]; ops
// on no connection (think, nop) run on every server, as uperf's slaves run
// them. Strand ids, connection ids and flowop positions stay those of the
// whole profile, so every server's statistics line up with the client's.
func (p *Profile) ServerView(hosts []string, i int) *Profile {
	q := &Profile{Name: p.Name, Groups: make([]Group, len(p.Groups))}
	for gi, g := range p.Groups {
		ng := g
		ng.Transactions = make([]Transaction, len(g.Transactions))
		for ti, t := range g.Transactions {
			nt := t
			nt.Flowops = make([]Flowop, len(t.Flowops))
			for fi, f := range t.Flowops {
				if f.UsesConn() {
					h := f.RemoteHost
					if h == "" {
						h = hosts[0]
					}
					f.Elsewhere = h != hosts[i]
				}
				nt.Flowops[fi] = f
			}
			ng.Transactions[ti] = nt
		}
		q.Groups[gi] = ng
	}
	return q
}

// HasElsewhere reports whether some op of the profile is marked Elsewhere
// (a server view of a multi-host profile).
func (p *Profile) HasElsewhere() bool {
	for _, g := range p.Groups {
		for _, t := range g.Transactions {
			for _, f := range t.Flowops {
				if f.Elsewhere {
					return true
				}
			}
		}
	}
	return false
}
