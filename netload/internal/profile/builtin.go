package profile

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// The seed-002 matrix: five workloads, each run with 1, 10, 50 and 250
// users. Request/response workloads (rr1c-REQxRESP) send REQ bytes from
// the client and answer with RESP bytes on one connection per user;
// streaming workloads (str-readxN, str-writexN) move N-byte messages in
// one direction only: "read" toward the client (the server writes),
// "write" away from it (the client writes).
var SeedWorkloads = []string{"rr1c-1x1", "rr1c-200x1000", "rr1c-1000x30k", "str-readx30k", "str-writex30k"}

// SeedUsers are the user counts of the seed matrix.
var SeedUsers = []int{1, 10, 50, 250}

var (
	rrName  = regexp.MustCompile(`^rr1c-([0-9]+[kKmM]?)x([0-9]+[kKmM]?)$`)
	strName = regexp.MustCompile(`^str-(read|write)x([0-9]+[kKmM]?)$`)
)

// Workload is a parsed workload (test) name.
type Workload struct {
	Base  string // e.g. rr1c-200x1000
	Users int    // 0 when the name has no --N suffix
	// Request and Response are the client's write and read sizes for rr;
	// for str, Request is the message size and Read tells the direction.
	Kind     string // "rr" or "str"
	Request  int64
	Response int64
	Read     bool
}

// ParseWorkloadName accepts a workload name with an optional users suffix:
// rr1c-REQxRESP or str-(read|write)xSIZE, then optionally --USERS. Sizes
// use uperf's binary units (30k = 30720 bytes).
func ParseWorkloadName(name string) (*Workload, error) {
	w := &Workload{Base: name}
	if base, users, ok := strings.Cut(name, "--"); ok {
		n, err := strconv.Atoi(users)
		if err != nil || n < 1 || n > MaxStrands {
			return nil, fmt.Errorf("workload %q: the part after -- is the number of users (1 to %d)", name, MaxStrands)
		}
		w.Base, w.Users = base, n
	}
	if m := rrName.FindStringSubmatch(w.Base); m != nil {
		req, err1 := ParseSize(m[1])
		resp, err2 := ParseSize(m[2])
		if err1 != nil || err2 != nil || req < 1 || resp < 1 || req > MaxSize || resp > MaxSize {
			return nil, fmt.Errorf("workload %q: request and response sizes must be 1 byte to 1 GiB", name)
		}
		w.Kind, w.Request, w.Response = "rr", req, resp
		return w, nil
	}
	if m := strName.FindStringSubmatch(w.Base); m != nil {
		n, err := ParseSize(m[2])
		if err != nil || n < 1 || n > MaxSize {
			return nil, fmt.Errorf("workload %q: the message size must be 1 byte to 1 GiB", name)
		}
		w.Kind, w.Request, w.Read = "str", n, m[1] == "read"
		return w, nil
	}
	return nil, fmt.Errorf("unknown workload %q (built-in: %s; or any rr1c-REQxRESP, str-readxSIZE, str-writexSIZE, optionally followed by --USERS)", name, strings.Join(SeedWorkloads, ", "))
}

// XML renders the workload as a uperf profile. The profile takes its
// remote host from $h, its number of users from $nprocs and the length of
// the timed transaction from $duration, so the same file works with uperf
// itself (export h=... nprocs=... duration=...).
func (w *Workload) XML() string {
	var b strings.Builder
	b.WriteString("<?xml version=\"1.0\"?>\n")
	switch w.Kind {
	case "rr":
		fmt.Fprintf(&b, "<!-- %s: request/response, one TCP connection per user; the client\n", w.Base)
		fmt.Fprintf(&b, "     writes a %d-byte request, the server answers with %d bytes. -->\n", w.Request, w.Response)
	default:
		dir := "the client writes, the server reads (data flows away from the client)"
		if w.Read {
			dir = "the server writes, the client reads (data flows toward the client)"
		}
		fmt.Fprintf(&b, "<!-- %s: streaming %d-byte messages, one TCP connection per user;\n", w.Base, w.Request)
		fmt.Fprintf(&b, "     %s. -->\n", dir)
	}
	fmt.Fprintf(&b, "<profile name=\"%s\">\n", w.Base)
	b.WriteString("  <group nprocs=\"$nprocs\">\n")
	b.WriteString("    <transaction iterations=\"1\">\n")
	// Request/response sets tcp_nodelay, as seed 002's own TCP_RR profile
	// does: a transaction must not wait for Nagle. Streams leave Nagle on,
	// as bulk transfers (backup, file copy) and iperf3 do and as uperf's
	// manual/throughput.xml does; with tcp_nodelay every 30 KiB write is
	// pushed as its own segment and a stream pays for twice the packets and
	// ACKs that the applications it stands for pay for.
	if w.Kind == "rr" {
		b.WriteString("      <flowop type=\"connect\" options=\"remotehost=$h protocol=tcp tcp_nodelay\"/>\n")
	} else {
		b.WriteString("      <flowop type=\"connect\" options=\"remotehost=$h protocol=tcp\"/>\n")
	}
	b.WriteString("    </transaction>\n")
	b.WriteString("    <transaction duration=\"$duration\">\n")
	switch {
	case w.Kind == "rr":
		fmt.Fprintf(&b, "      <flowop type=\"write\" options=\"size=%s\"/>\n", FormatSize(w.Request))
		fmt.Fprintf(&b, "      <flowop type=\"read\" options=\"size=%s\"/>\n", FormatSize(w.Response))
	case w.Read:
		fmt.Fprintf(&b, "      <flowop type=\"read\" options=\"size=%s\"/>\n", FormatSize(w.Request))
	default:
		fmt.Fprintf(&b, "      <flowop type=\"write\" options=\"size=%s\"/>\n", FormatSize(w.Request))
	}
	b.WriteString("    </transaction>\n")
	b.WriteString("    <transaction iterations=\"1\">\n")
	b.WriteString("      <flowop type=\"disconnect\"/>\n")
	b.WriteString("    </transaction>\n")
	b.WriteString("  </group>\n")
	b.WriteString("</profile>\n")
	return b.String()
}

// TestName is the full seed-style name, e.g. rr1c-200x1000--10.
func (w *Workload) TestName(users int) string {
	return fmt.Sprintf("%s--%d", w.Base, users)
}
