package profile

import (
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"testing"
	"time"

	"kvmtune/netload/profiles"
)

var testVars = MapLookup(map[string]string{
	"h": "127.0.0.1", "nprocs": "10", "nthr": "4", "duration": "2s", "proto": "tcp",
}, nil)

func TestShippedProfilesParse(t *testing.T) {
	files, err := fs.Glob(profiles.FS, "*.xml")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 10 {
		t.Fatalf("expected at least 10 shipped profiles, found %d", len(files))
	}
	for _, f := range files {
		t.Run(f, func(t *testing.T) {
			src, err := profiles.FS.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			p, err := Parse(src, f, testVars)
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			if len(p.Groups) == 0 || p.Strands() == 0 || p.Steps() == 0 {
				t.Fatalf("empty profile: %+v", p)
			}
			if hosts := p.RemoteHosts(); len(hosts) != 1 || hosts[0] != "127.0.0.1" {
				t.Fatalf("remote hosts %v, want [127.0.0.1]", hosts)
			}
		})
	}
}

// The five seed workloads under profiles/ are exactly what the built-in
// workload generator runs.
func TestSeedProfilesMatchBuiltins(t *testing.T) {
	for _, name := range SeedWorkloads {
		src, err := profiles.FS.ReadFile(name + ".xml")
		if err != nil {
			t.Fatalf("%s.xml not shipped: %v", name, err)
		}
		w, err := ParseWorkloadName(name)
		if err != nil {
			t.Fatal(err)
		}
		if got := w.XML(); got != string(src) {
			t.Errorf("%s.xml differs from the built-in workload; regenerate with `netload profile --xml --workload %s`", name, name)
		}
	}
}

func TestSeedWorkloadsMeaning(t *testing.T) {
	cases := []struct {
		name           string
		users          int
		clientOps      []Op
		clientSizes    []int64
		serverOps      []Op
		wantRead, want int64 // client bytes read / written per pass
	}{
		{"rr1c-1x1--1", 1, []Op{OpWrite, OpRead}, []int64{1, 1}, []Op{OpRead, OpWrite}, 1, 1},
		{"rr1c-200x1000--10", 10, []Op{OpWrite, OpRead}, []int64{200, 1000}, []Op{OpRead, OpWrite}, 1000, 200},
		{"rr1c-1000x30k--50", 50, []Op{OpWrite, OpRead}, []int64{1000, 30720}, []Op{OpRead, OpWrite}, 30720, 1000},
		{"str-readx30k--250", 250, []Op{OpRead}, []int64{30720}, []Op{OpWrite}, 30720, 0},
		{"str-writex30k--1", 1, []Op{OpWrite}, []int64{30720}, []Op{OpRead}, 0, 30720},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w, err := ParseWorkloadName(c.name)
			if err != nil {
				t.Fatal(err)
			}
			if w.Users != c.users {
				t.Fatalf("users %d, want %d", w.Users, c.users)
			}
			vars := MapLookup(map[string]string{"h": "198.18.0.2", "nprocs": "7", "duration": "30"}, nil)
			p, err := Parse([]byte(w.XML()), "builtin", vars)
			if err != nil {
				t.Fatal(err)
			}
			g := p.Groups[0]
			if g.Strands != 7 || !g.Procs {
				t.Fatalf("strands %d procs %v, want 7 from $nprocs", g.Strands, g.Procs)
			}
			if len(g.Transactions) != 3 {
				t.Fatalf("want connect / timed / disconnect, got %d transactions", len(g.Transactions))
			}
			timed := g.Transactions[1]
			if timed.Duration != 30*time.Second || timed.Iterations != 0 {
				t.Fatalf("timed transaction: duration %v iterations %d", timed.Duration, timed.Iterations)
			}
			for i, f := range timed.Flowops {
				if f.Type != c.clientOps[i] || f.Size != c.clientSizes[i] {
					t.Fatalf("flowop %d: %s %d, want %s %d", i, f.Type, f.Size, c.clientOps[i], c.clientSizes[i])
				}
			}
			r, wr := timed.BytesPerPass()
			if r != c.wantRead || wr != c.want {
				t.Fatalf("bytes per pass read %d written %d, want %d %d", r, wr, c.wantRead, c.want)
			}
			opp := p.Opposite().Groups[0].Transactions[1]
			for i, f := range opp.Flowops {
				if f.Type != c.serverOps[i] || f.Size != c.clientSizes[i] {
					t.Fatalf("server flowop %d: %s %d", i, f.Type, f.Size)
				}
			}
			if conn := g.Transactions[0].Flowops[0]; conn.Type != OpConnect || conn.RemoteHost != "198.18.0.2" {
				t.Fatalf("connect flowop %+v", conn)
			}
			// request/response without Nagle (seed 002's TCP_RR); streams with
			// it, as iperf3 and bulk transfers run
			if conn := g.Transactions[0].Flowops[0]; conn.NoDelay != (w.Kind == "rr") {
				t.Fatalf("%s: tcp_nodelay %v", c.name, conn.NoDelay)
			}
		})
	}
}

func TestWorkloadNames(t *testing.T) {
	good := map[string][3]int64{ // kind(0 rr,1 str-read,2 str-write), request, response
		"rr1c-64x64":    {0, 64, 64},
		"rr1c-1kx1m--3": {0, 1024, 1 << 20},
		"str-writex8k":  {2, 8192, 0},
		"str-readx1":    {1, 1, 0},
	}
	for n, want := range good {
		w, err := ParseWorkloadName(n)
		if err != nil {
			t.Fatalf("%s: %v", n, err)
		}
		kind := int64(0)
		if w.Kind == "str" {
			kind = 2
			if w.Read {
				kind = 1
			}
		}
		if kind != want[0] || w.Request != want[1] || w.Response != want[2] {
			t.Errorf("%s: got %+v", n, w)
		}
	}
	for _, n := range []string{"", "rr1c-0x1", "rr1c-1x", "rr2c-1x1", "str-sidewaysx1k", "rr1c-1x1--0", "rr1c-1x1--x", "str-readx30k--1000000", "rr1c-2gx1"} {
		if _, err := ParseWorkloadName(n); err == nil {
			t.Errorf("%q: expected an error", n)
		}
	}
}

// marker shows where an error must point; it is removed before parsing.
const marker = "¦"

func TestBadProfiles(t *testing.T) {
	cases := []struct {
		name string
		src  string
		msg  string
	}{
		{"unknown flowop", `<profile name="x"><group nthreads="1"><transaction>
  <flowop type="¦jump" options="size=1"/></transaction></group></profile>`, `unknown flowop type "jump"`},
		{"sendfile unsupported", `<profile name="x"><group nthreads="1"><transaction>
  <flowop type="¦sendfile"/></transaction></group></profile>`, `flowop type "sendfile" is not supported`},
		{"unknown option", `<profile name="x"><group nthreads="1"><transaction iterations="1">
    <flowop type="connect" options="remotehost=a"/>
    <flowop type="write" options="size=1 ¦fancy=3"/></transaction></group></profile>`, `unknown option "fancy=3"`},
		{"unsupported option", `<profile name="x"><group nthreads="1"><transaction>
    <flowop type="connect" options="remotehost=a ¦localhost=b"/></transaction></group></profile>`, `option "localhost" is not supported`},
		{"sctp option", `<profile name="x"><group nthreads="1"><transaction>
    <flowop type="connect" options="¦sctp_nodelay"/></transaction></group></profile>`, `not supported by netload (SCTP)`},
		{"option on wrong flowop", `<profile name="x"><group nthreads="1"><transaction>
    <flowop type="connect" options="remotehost=a ¦size=5"/></transaction></group></profile>`, `option "size" does not apply to flowop connect`},
		{"zero size", `<profile name="x"><group nthreads="1"><transaction>
    <flowop type="connect" options="remotehost=a"/>
    <flowop type="write" options="size=¦0"/></transaction></group></profile>`, `option size: must be positive`},
		{"negative size", `<profile name="x"><group nthreads="1"><transaction>
    <flowop type="connect" options="remotehost=a"/>
    <flowop type="read" options="size=¦-4k"/></transaction></group></profile>`, `option size: must be positive`},
		{"bad size suffix", `<profile name="x"><group nthreads="1"><transaction>
    <flowop type="connect" options="remotehost=a"/>
    <flowop type="read" options="size=¦4q"/></transaction></group></profile>`, `unknown size suffix`},
		{"random size", `<profile name="x"><group nthreads="1"><transaction>
    <flowop type="connect" options="remotehost=a"/>
    <flowop type="read" options="size=¦rand(1,5)"/></transaction></group></profile>`, `random sizes`},
		{"missing size", `<profile name="x"><group nthreads="1"><transaction>
    <flowop type="connect" options="remotehost=a"/>
    ¦<flowop type="read"/></transaction></group></profile>`, `flowop read needs size=`},
		{"zero count", `<profile name="x"><group nthreads="1"><transaction>
    <flowop type="connect" options="remotehost=a"/>
    <flowop type="read" options="size=1 count=¦0"/></transaction></group></profile>`, `option count: must be between 1`},
		{"zero threads", `<profile name="x"><group nthreads="¦0"><transaction>
    <flowop type="nop"/></transaction></group></profile>`, `nthreads must be at least 1`},
		{"negative procs", `<profile name="x"><group nprocs="¦-3"><transaction>
    <flowop type="nop"/></transaction></group></profile>`, `nprocs must be at least 1`},
		{"threads and procs", `<profile name="x"><group nthreads="1" ¦nprocs="2"><transaction>
    <flowop type="nop"/></transaction></group></profile>`, `both nthreads and nprocs`},
		{"no strands", `<profile name="x">
 ¦<group><transaction><flowop type="nop"/></transaction></group></profile>`, `needs nthreads or nprocs`},
		{"iteration typo", `<profile name="x"><group nthreads="1"><transaction ¦iteration="3">
    <flowop type="nop"/></transaction></group></profile>`, `did you mean iterations`},
		{"negative duration", `<profile name="x"><group nthreads="1"><transaction duration="¦-5s">
    <flowop type="nop"/></transaction></group></profile>`, `duration must be positive`},
		{"bad time unit", `<profile name="x"><group nthreads="1"><transaction duration="¦5h">
    <flowop type="nop"/></transaction></group></profile>`, `unknown time suffix`},
		{"iterations and duration", `<profile name="x"><group nthreads="1">¦<transaction duration="5" iterations="2">
    <flowop type="nop"/></transaction></group></profile>`, `both iterations and duration`},
		{"zero rate", `<profile name="x"><group nthreads="1"><transaction duration="5" rate="¦0">
    <flowop type="nop"/></transaction></group></profile>`, `rate must be positive`},
		{"unknown element", `<profile name="x"><group nthreads="1">
   ¦<txn/></group></profile>`, `unknown element <txn>`},
		{"flowop outside transaction", `<profile name="x"><group nthreads="1">
   ¦<flowop type="nop"/></group></profile>`, `<flowop> belongs inside <transaction>`},
		{"unknown attribute", `<profile name="x" ¦owner="me"><group nthreads="1"><transaction>
    <flowop type="nop"/></transaction></group></profile>`, `unknown attribute "owner" on <profile>`},
		{"empty transaction", `<profile name="x"><group nthreads="1">
  ¦<transaction iterations="2"></transaction></group></profile>`, `<transaction> has no <flowop>`},
		{"empty group", `<profile name="x">
  ¦<group nthreads="1"></group></profile>`, `has no <transaction>`},
		{"read before connect", `<profile name="x"><group nthreads="1"><transaction>
    ¦<flowop type="read" options="size=1"/></transaction></group></profile>`, `comes before any connect or accept`},
		{"unopened conn", `<profile name="x"><group nthreads="1"><transaction>
    <flowop type="connect" options="conn=1"/>
    ¦<flowop type="write" options="size=1 conn=2"/></transaction></group></profile>`, `connection 2, which no earlier connect`},
		{"unset variable", `<profile name="x"><group nthreads="1"><transaction>
    <flowop type="connect" options="remotehost=¦$nosuchvar"/></transaction></group></profile>`, `variable $nosuchvar is not set`},
		{"unsupported protocol", `<profile name="x"><group nthreads="1"><transaction>
    <flowop type="connect" options="protocol=¦ssl"/></transaction></group></profile>`, `protocol "ssl" is not supported`},
		{"unknown protocol", `<profile name="x"><group nthreads="1"><transaction>
    <flowop type="connect" options="protocol=¦quic"/></transaction></group></profile>`, `unknown protocol "quic"`},
		{"flag with value", `<profile name="x"><group nthreads="1"><transaction>
    <flowop type="connect" options="¦tcp_nodelay=1"/></transaction></group></profile>`, `takes no value`},
		{"value missing", `<profile name="x"><group nthreads="1"><transaction>
    <flowop type="connect" options="¦port"/></transaction></group></profile>`, `needs a value`},
		{"bad port", `<profile name="x"><group nthreads="1"><transaction>
    <flowop type="connect" options="port=¦70000"/></transaction></group></profile>`, `port number`},
		{"udp too big", `<profile name="x"><group nthreads="1"><transaction>
    <flowop type="connect" options="protocol=udp"/>
    ¦<flowop type="write" options="size=65508"/></transaction></group></profile>`, `UDP datagram holds at most`},
		{"udp fixed port shared", `<profile name="x"><group nthreads="2"><transaction>
    ¦<flowop type="connect" options="protocol=udp port=3000"/></transaction></group></profile>`, `fixed port serves one strand`},
		{"think without duration", `<profile name="x"><group nthreads="1"><transaction>
    ¦<flowop type="think"/></transaction></group></profile>`, `think needs duration=`},
		{"busy and idle", `<profile name="x"><group nthreads="1"><transaction>
    <flowop type="think" options="¦duration=1ms busy idle"/></transaction></group></profile>`, `busy and idle exclude`},
		{"option twice", `<profile name="x"><group nthreads="1"><transaction>
    <flowop type="connect" options="remotehost=a ¦remotehost=b"/></transaction></group></profile>`, `given twice`},
		{"text inside", `<profile name="x"><group nthreads="1">
  ¦hello<transaction><flowop type="nop"/></transaction></group></profile>`, `unexpected text "hello"`},
		{"no profile", `¦<!-- nothing here -->`, `no <profile> element`},
		{"nested profile", `<profile name="x"><group nthreads="1">¦<profile/></group></profile>`, `<profile> must be the outermost`},
		{"no group", `¦<profile name="x"></profile>`, `has no <group>`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			idx := strings.Index(c.src, marker)
			if idx < 0 {
				t.Fatal("test case has no marker")
			}
			src := strings.Replace(c.src, marker, "", 1)
			want := posOf(c.src[:idx])
			_, err := Parse([]byte(src), "bad.xml", testVars)
			if err == nil {
				t.Fatalf("parsed without error, want %q", c.msg)
			}
			var pe *Error
			if !errors.As(err, &pe) {
				t.Fatalf("error %T %v is not a *profile.Error", err, err)
			}
			if !strings.Contains(pe.Msg, c.msg) {
				t.Errorf("message %q does not contain %q", pe.Msg, c.msg)
			}
			if pe.Pos != want {
				t.Errorf("position %v, want %v (%v)", pe.Pos, want, err)
			}
			if !strings.HasPrefix(err.Error(), "bad.xml:"+want.String()+": ") {
				t.Errorf("error text %q does not start with file:line:col", err.Error())
			}
		})
	}
}

func posOf(prefix string) Pos {
	line := strings.Count(prefix, "\n") + 1
	last := strings.LastIndex(prefix, "\n")
	return Pos{Line: line, Col: len([]rune(prefix[last+1:])) + 1}
}

// Malformed XML is reported with the decoder's line (and a column).
func TestMalformedXML(t *testing.T) {
	cases := []struct {
		src  string
		line int
	}{
		{"<profile name=\"x\">\n<group nthreads=\"1\">\n<transaction>\n<flowop type=\"nop\">\n</transaction>", 5},
		{"<profile name=\"x\"\n  <group/>", 2},
		{"<profile name=x>", 1},
		{"<profile name=\"x\"><group nthreads=\"1\"><transaction><flowop type=\"nop\"/></transaction></group>", 1},
		{"\xff\xfe<profile/>", 0},
	}
	for _, c := range cases {
		_, err := Parse([]byte(c.src), "m.xml", nil)
		var pe *Error
		if !errors.As(err, &pe) {
			t.Fatalf("%q: error %v is not a *profile.Error", c.src, err)
		}
		if c.line > 0 && (pe.Pos.Line != c.line || pe.Pos.Col < 1) {
			t.Errorf("%q: position %v, want line %d", c.src, pe.Pos, c.line)
		}
	}
}

func TestVariablesAndDefaults(t *testing.T) {
	src := `<?xml version="1.0"?>
<!-- comment -->
<PROFILE name="$name">
  <group nthreads="${n}">
    <transaction>
      <flowop type="Connect" options="remotehost=$h
         protocol=$proto wndsz=$w TCP_NODELAY"/>
    </transaction>
    <transaction duration="$d">
      <flowop type="send" options="size=$s count=2"/>
      <flowop type="recv" options="size=3 rsize=5"/>
    </transaction>
    <transaction>
      <flowop type="disconnect" />
    </transaction>
  </group>
</PROFILE>`
	vars := MapLookup(map[string]string{"name": "vars", "n": "3", "h": "::1", "proto": "TCP", "w": "1m", "d": "250m", "s": "1.5k"}, nil)
	p, err := Parse([]byte(src), "v.xml", vars)
	if err != nil {
		t.Fatal(err)
	}
	if p.Name != "vars" || p.Groups[0].Strands != 3 || p.Groups[0].Name != "Group0" {
		t.Fatalf("profile %+v", p)
	}
	c := p.Groups[0].Transactions[0]
	if c.Iterations != 1 {
		t.Fatalf("default iterations %d, want 1", c.Iterations)
	}
	f := c.Flowops[0]
	if f.Type != OpConnect || f.RemoteHost != "::1" || f.Protocol != "tcp" || f.WndSz != 1<<20 || !f.NoDelay {
		t.Fatalf("connect %+v", f)
	}
	tt := p.Groups[0].Transactions[1]
	if tt.Duration != 250*time.Millisecond {
		t.Fatalf("duration %v, want 250ms (uperf's m is milliseconds)", tt.Duration)
	}
	if w := tt.Flowops[0]; w.Type != OpWrite || w.Size != 1536 || w.Count != 2 {
		t.Fatalf("send -> %+v", w)
	}
	if r := tt.Flowops[1]; r.Type != OpRead || r.PeerSize() != 5 {
		t.Fatalf("recv -> %+v", r)
	}
	opp := p.Opposite().Groups[0].Transactions[1].Flowops
	// TCP: the peer writes the 3 bytes the controller reads, in one piece of at most rsize
	if opp[0].Type != OpRead || opp[0].Size != 1536 || opp[1].Type != OpWrite || opp[1].Size != 5 || opp[1].RSize != 3 ||
		opp[1].Count != 1 || opp[1].LastSize != 3 {
		t.Fatalf("opposite %+v", opp)
	}
	if p.Opposite().Groups[0].Transactions[0].Flowops[0].Type != OpAccept {
		t.Fatal("connect's opposite is not accept")
	}
}

func TestUnits(t *testing.T) {
	sizes := map[string]int64{"1": 1, "64k": 65536, "64K": 65536, "1m": 1 << 20, "2g": 2 << 30, "30kb": 30720, "1.5k": 1536, "8b": 8, "0": 0}
	for s, want := range sizes {
		got, err := ParseSize(s)
		if err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", s, got, err, want)
		}
	}
	for _, s := range []string{"", "k", "1x", "1.3", "1kk", "99999999999e"} {
		if _, err := ParseSize(s); err == nil {
			t.Errorf("ParseSize(%q): expected an error", s)
		}
	}
	times := map[string]time.Duration{"30": 30 * time.Second, "30s": 30 * time.Second, "5m": 5 * time.Millisecond,
		"5ms": 5 * time.Millisecond, "10us": 10 * time.Microsecond, "7n": 7, "0.5": 500 * time.Millisecond}
	for s, want := range times {
		got, err := ParseTime(s)
		if err != nil || got != want {
			t.Errorf("ParseTime(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	for _, s := range []string{"", "s", "5h", "5min", "1e400"} {
		if _, err := ParseTime(s); err == nil {
			t.Errorf("ParseTime(%q): expected an error", s)
		}
	}
}

func TestConnResolution(t *testing.T) {
	src := `<profile name="c"><group nthreads="1">
 <transaction><flowop type="connect" options="conn=4"/><flowop type="accept" options="conn=9"/></transaction>
 <transaction iterations="3"><flowop type="write" options="size=1"/><flowop type="read" options="size=1 conn=4"/></transaction>
 <transaction><flowop type="disconnect" options="conn=9"/><flowop type="write" options="size=2"/></transaction>
 </group></profile>`
	p, err := Parse([]byte(src), "c.xml", nil)
	if err != nil {
		t.Fatal(err)
	}
	g := p.Groups[0]
	if got := g.Transactions[1].Flowops[0].Conn; got != 9 {
		t.Errorf("write without conn= uses %d, want the most recent (9)", got)
	}
	if got := g.Transactions[2].Flowops[1].Conn; got != 4 {
		t.Errorf("after disconnecting 9, write uses %d, want 4", got)
	}
	if g.ConnsPerStrand() != 2 {
		t.Errorf("ConnsPerStrand %d, want 2", g.ConnsPerStrand())
	}
}

// TCP ops with rsize: the peer moves the controller's size*count bytes per
// pass in rsize pieces (uperf's slave does the same); UDP keeps one datagram
// of rsize per op.
func TestOppositeWithRSizeMovesTheSameBytes(t *testing.T) {
	src := `<profile name="r"><group nthreads="1">
  <transaction><flowop type="connect" options="conn=1 remotehost=h"/><flowop type="connect" options="conn=2 remotehost=h protocol=udp"/></transaction>
  <transaction iterations="2">
    <flowop type="write" options="conn=1 count=6 size=4k rsize=10k"/>
    <flowop type="read" options="conn=1 size=9k rsize=3k"/>
    <flowop type="write" options="conn=2 count=2 size=100 rsize=50"/>
  </transaction></group></profile>`
	p, err := Parse([]byte(src), "r.xml", nil)
	if err != nil {
		t.Fatal(err)
	}
	opp := p.Opposite().Groups[0].Transactions[1].Flowops
	for i, want := range []struct{ size, count, last int64 }{{10240, 3, 4096}, {3072, 3, 0}, {50, 2, 0}} {
		f := opp[i]
		if f.Size != want.size || f.Count != want.count || f.LastSize != want.last {
			t.Errorf("op %d: size %d count %d last %d, want %+v", i, f.Size, f.Count, f.LastSize, want)
		}
		orig := p.Groups[0].Transactions[1].Flowops[i]
		if orig.Protocol == "tcp" {
			peer := (f.Count-1)*f.Size + max(f.LastSize, 0)
			if f.LastSize == 0 {
				peer = f.Count * f.Size
			}
			if peer != orig.Size*orig.Count {
				t.Errorf("op %d: peer moves %d bytes, controller %d", i, peer, orig.Size*orig.Count)
			}
		}
	}
}

// Every op on a connection is bound to the host its connection goes to, and
// each server's view marks the ops on other hosts' connections (uperf's
// two-hosts.xml: one strand writes to $h1 and reads from $h2 in one pass).
func TestServerViewSplitsAStrandsOpsByHost(t *testing.T) {
	src := `<profile name="m">
  <group nthreads="2">
    <transaction><flowop type="connect" options="remotehost=$h1"/><flowop type="connect" options="conn=1 remotehost=$h2 protocol=udp"/></transaction>
    <transaction duration="1s"><flowop type="write" options="size=300"/><flowop type="read" options="conn=1 size=300"/><flowop type="think" options="duration=1ms"/></transaction>
    <transaction><flowop type="disconnect" options="remotehost=$h2"/><flowop type="disconnect" options="conn=1"/></transaction>
  </group>
  <group nthreads="1"><transaction><flowop type="connect" options="conn=3"/><flowop type="write" options="conn=3 size=1"/></transaction></group>
</profile>`
	p, err := Parse([]byte(src), "m.xml", MapLookup(map[string]string{"h1": "a", "h2": "b"}, nil))
	if err != nil {
		t.Fatal(err)
	}
	if hosts := p.RemoteHosts(); len(hosts) != 2 || hosts[0] != "a" || hosts[1] != "b" {
		t.Fatalf("hosts %v", hosts)
	}
	g := p.Groups[0].Transactions
	// a data op or a disconnect takes its connection's host (the remotehost
	// written on a disconnect is not the one that counts)
	for _, c := range []struct {
		f    Flowop
		host string
	}{{g[1].Flowops[0], "a"}, {g[1].Flowops[1], "b"}, {g[1].Flowops[2], ""}, {g[2].Flowops[0], "a"}, {g[2].Flowops[1], "b"}} {
		if c.f.RemoteHost != c.host {
			t.Errorf("%s conn %d: host %q, want %q", c.f.Type, c.f.Conn, c.f.RemoteHost, c.host)
		}
	}
	hosts := p.RemoteHosts()
	elsewhere := func(q *Profile) [][]bool {
		var out [][]bool
		for _, g := range q.Groups {
			for _, t := range g.Transactions {
				var row []bool
				for _, f := range t.Flowops {
					row = append(row, f.Elsewhere)
				}
				out = append(out, row)
			}
		}
		return out
	}
	a, b := p.ServerView(hosts, 0), p.ServerView(hosts, 1)
	// think runs on every server; group 2 names no host, so it is the first host's
	wantA := [][]bool{{false, true}, {false, true, false}, {false, true}, {false, false}}
	wantB := [][]bool{{true, false}, {true, false, false}, {true, false}, {true, true}}
	if fmt.Sprint(elsewhere(a)) != fmt.Sprint(wantA) || fmt.Sprint(elsewhere(b)) != fmt.Sprint(wantB) {
		t.Fatalf("views:\n a %v, want %v\n b %v, want %v", elsewhere(a), wantA, elsewhere(b), wantB)
	}
	if !a.HasElsewhere() || p.HasElsewhere() || elsewhere(p)[0][1] {
		t.Fatal("the view must be a copy: the profile itself is unmarked")
	}
	// the serving side's opposite keeps the marks
	if o := b.Opposite(); !o.Groups[0].Transactions[1].Flowops[0].Elsewhere || o.Groups[0].Transactions[1].Flowops[1].Type != OpWrite {
		t.Fatalf("opposite of the view: %+v", o.Groups[0].Transactions[1].Flowops)
	}
}

// A flowop without conn= uses the anonymous connection while it is open,
// as in uperf (two-hosts.xml opens an anonymous and a conn=1 connection).
func TestFlowopWithoutConnUsesTheAnonymousConnection(t *testing.T) {
	src := `<profile name="a"><group nthreads="1">
  <transaction><flowop type="connect" options="remotehost=h"/><flowop type="connect" options="conn=1 remotehost=h"/></transaction>
  <transaction><flowop type="write" options="size=1"/><flowop type="read" options="conn=1 size=1"/></transaction>
  <transaction><flowop type="disconnect"/><flowop type="disconnect" options="conn=1"/></transaction>
</group></profile>`
	p, err := Parse([]byte(src), "a.xml", nil)
	if err != nil {
		t.Fatal(err)
	}
	tx := p.Groups[0].Transactions
	if tx[1].Flowops[0].Conn != 0 || tx[1].Flowops[1].Conn != 1 || tx[2].Flowops[0].Conn != 0 || tx[2].Flowops[1].Conn != 1 {
		t.Fatalf("connections: %+v %+v", tx[1].Flowops, tx[2].Flowops)
	}
}

func TestTCPOptionsFromUperf(t *testing.T) {
	src := `<profile name="x"><group nthreads="1"><transaction iterations="1">
    <flowop type="connect" options="remotehost=a cc=cubic stack=rack bblog=1"/></transaction></group></profile>`
	p, err := Parse([]byte(src), "p.xml", MapLookup(nil, nil))
	if err != nil {
		t.Fatal(err)
	}
	if f := p.Groups[0].Transactions[0].Flowops[0]; f.CC != "cubic" {
		t.Fatalf("cc: %+v", f)
	}
	if len(p.Warnings) != 2 || !strings.Contains(p.Warnings[0], "option stack is ignored: it is a FreeBSD TCP option") ||
		!strings.Contains(p.Warnings[1], "option bblog is ignored") {
		t.Fatalf("warnings %q", p.Warnings)
	}
	for _, bad := range []string{"cc=Cubic", "cc=../x", "cc=averyveryverylongname"} {
		src := `<profile name="x"><group nthreads="1"><transaction iterations="1">
    <flowop type="connect" options="remotehost=a ` + bad + `"/></transaction></group></profile>`
		if _, err := Parse([]byte(src), "p.xml", MapLookup(nil, nil)); err == nil || !strings.Contains(err.Error(), "is not a congestion control name") {
			t.Fatalf("%s: %v", bad, err)
		}
	}
}
