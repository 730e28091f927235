package profile

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Limits that keep a profile from asking for absurd resources.
const (
	MaxStrands   = 100000
	MaxGroups    = 1024 // uperf's MAXTHREADGROUPS
	MaxSize      = 1 << 30
	MaxUDPSize   = 65507
	MaxCount     = 1 << 30
	MaxConnID    = 1 << 16
	maxInputSize = 4 << 20
)

// Error is a profile error with its place in the file.
type Error struct {
	File string
	Pos  Pos
	Msg  string
}

func (e *Error) Error() string {
	f := e.File
	if f == "" {
		f = "profile"
	}
	if e.Pos.Line == 0 {
		return fmt.Sprintf("%s: %s", f, e.Msg)
	}
	return fmt.Sprintf("%s:%d:%d: %s", f, e.Pos.Line, e.Pos.Col, e.Msg)
}

// Lookup resolves $VAR references; ok is false when the variable is unset.
type Lookup func(name string) (value string, ok bool)

// EnvLookup resolves variables from the process environment.
func EnvLookup(name string) (string, bool) { return os.LookupEnv(name) }

// MapLookup resolves from m first, then from next (which may be nil).
func MapLookup(m map[string]string, next Lookup) Lookup {
	return func(name string) (string, bool) {
		if v, ok := m[name]; ok {
			return v, true
		}
		if next != nil {
			return next(name)
		}
		return "", false
	}
}

// ParseFile reads and parses a profile file.
func ParseFile(path string, vars Lookup) (*Profile, []byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, nil, fmt.Errorf("profile: %w", err)
	}
	if st.IsDir() {
		return nil, nil, fmt.Errorf("profile: %s is a directory", path)
	}
	if st.Size() > maxInputSize {
		return nil, nil, fmt.Errorf("profile: %s is larger than %d bytes", path, maxInputSize)
	}
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("profile: %w", err)
	}
	p, err := Parse(src, path, vars)
	return p, src, err
}

// Parse parses src; file names the source in error messages.
func Parse(src []byte, file string, vars Lookup) (*Profile, error) {
	if vars == nil {
		vars = func(string) (string, bool) { return "", false }
	}
	ps := &parser{src: src, file: file, vars: vars}
	ps.index()
	p, err := ps.parse()
	if err != nil {
		return nil, err
	}
	return p, nil
}

type parser struct {
	warned map[string]bool
	warns  []string
	src    []byte
	file   string
	vars   Lookup
	lines  []int // offsets of line starts
}

func (ps *parser) index() {
	ps.lines = []int{0}
	for i, b := range ps.src {
		if b == '\n' {
			ps.lines = append(ps.lines, i+1)
		}
	}
}

// pos converts a byte offset into a line and a character column.
func (ps *parser) pos(off int) Pos {
	if off < 0 {
		off = 0
	}
	if off > len(ps.src) {
		off = len(ps.src)
	}
	l := sort.Search(len(ps.lines), func(i int) bool { return ps.lines[i] > off }) - 1
	if l < 0 {
		l = 0
	}
	return Pos{Line: l + 1, Col: utf8.RuneCount(ps.src[ps.lines[l]:off]) + 1}
}

// warnf records a warning once per distinct message (the first place is named).
func (ps *parser) warnf(off int, format string, a ...any) {
	msg := fmt.Sprintf(format, a...)
	if ps.warned[msg] {
		return
	}
	if ps.warned == nil {
		ps.warned = map[string]bool{}
	}
	ps.warned[msg] = true
	ps.warns = append(ps.warns, (&Error{File: ps.file, Pos: ps.pos(off), Msg: "warning: " + msg}).Error())
}

func (ps *parser) errf(off int, format string, a ...any) *Error {
	return &Error{File: ps.file, Pos: ps.pos(off), Msg: fmt.Sprintf(format, a...)}
}

// attr is one attribute with the offset of its name and of its value.
type attr struct {
	name, value string
	nameOff     int
	valOff      int
	raw         string // raw (undecoded) value text, for option offsets
}

// element is a start tag with its attributes and offset.
type element struct {
	name  string
	off   int
	attrs []attr
}

// locateAttrs finds where each attribute sits in the raw tag text.
func (ps *parser) locateAttrs(se xml.StartElement, start, end int) element {
	el := element{name: se.Name.Local, off: start}
	raw := ""
	if start >= 0 && end <= len(ps.src) && start < end {
		raw = string(ps.src[start:end])
	}
	searchFrom := 1 + len(se.Name.Local)
	for _, a := range se.Attr {
		at := attr{name: a.Name.Local, value: a.Value, nameOff: start, valOff: start}
		if a.Name.Space != "" {
			at.name = a.Name.Space + ":" + a.Name.Local
		}
		if k := indexAttr(raw, at.name, searchFrom); k >= 0 {
			at.nameOff = start + k
			eq := strings.IndexByte(raw[k:], '=')
			if eq >= 0 {
				q := k + eq + 1
				for q < len(raw) && (raw[q] == ' ' || raw[q] == '\t' || raw[q] == '\n' || raw[q] == '\r') {
					q++
				}
				if q < len(raw) && (raw[q] == '"' || raw[q] == '\'') {
					quote := raw[q]
					endq := strings.IndexByte(raw[q+1:], quote)
					if endq >= 0 {
						at.valOff = start + q + 1
						at.raw = raw[q+1 : q+1+endq]
						searchFrom = q + 1 + endq + 1
					}
				}
			}
		}
		el.attrs = append(el.attrs, at)
	}
	return el
}

// indexAttr finds `name` followed by optional space and '=' in raw, at a
// word boundary, from position from.
func indexAttr(raw, name string, from int) int {
	for from < len(raw) {
		k := strings.Index(raw[from:], name)
		if k < 0 {
			return -1
		}
		k += from
		before := byte(' ')
		if k > 0 {
			before = raw[k-1]
		}
		rest := strings.TrimLeft(raw[k+len(name):], " \t\r\n")
		if (before == ' ' || before == '\t' || before == '\n' || before == '\r') && strings.HasPrefix(rest, "=") {
			return k
		}
		from = k + 1
	}
	return -1
}

func (ps *parser) parse() (*Profile, error) {
	if len(ps.src) > maxInputSize {
		return nil, &Error{File: ps.file, Msg: fmt.Sprintf("profile is larger than %d bytes", maxInputSize)}
	}
	if !utf8.Valid(ps.src) {
		return nil, &Error{File: ps.file, Msg: "profile is not valid UTF-8 text"}
	}
	d := xml.NewDecoder(bytes.NewReader(ps.src))
	d.Strict = true
	d.CharsetReader = func(charset string, input io.Reader) (io.Reader, error) {
		if strings.EqualFold(charset, "us-ascii") || strings.EqualFold(charset, "iso-8859-1") {
			return input, nil
		}
		return nil, fmt.Errorf("unsupported encoding %q (use UTF-8)", charset)
	}

	var prof *Profile
	var group *Group
	var txn *Transaction
	var stack []string
	rootSeen := false

	for {
		off := int(d.InputOffset())
		tok, err := d.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			var se *xml.SyntaxError
			line, col := d.InputPos()
			msg := err.Error()
			if errors.As(err, &se) {
				msg = se.Msg
			}
			return nil, &Error{File: ps.file, Pos: Pos{line, col}, Msg: "malformed XML: " + msg}
		}
		end := int(d.InputOffset())
		switch t := tok.(type) {
		case xml.StartElement:
			el := ps.locateAttrs(t, off, end)
			if t.Name.Space != "" {
				return nil, ps.errf(off, "unknown element <%s:%s>", t.Name.Space, t.Name.Local)
			}
			parent := ""
			if len(stack) > 0 {
				parent = stack[len(stack)-1]
			}
			name := strings.ToLower(t.Name.Local)
			switch name {
			case "profile":
				if parent != "" {
					return nil, ps.errf(off, "<profile> must be the outermost element, not inside <%s>", parent)
				}
				if rootSeen {
					return nil, ps.errf(off, "a file holds one <profile>")
				}
				rootSeen = true
				p, err := ps.profileAttrs(el)
				if err != nil {
					return nil, err
				}
				prof = p
			case "group":
				if parent != "profile" {
					return nil, ps.errf(off, "<group> belongs inside <profile>%s", inside(parent))
				}
				if len(prof.Groups) >= MaxGroups {
					return nil, ps.errf(off, "too many groups (at most %d)", MaxGroups)
				}
				g, err := ps.groupAttrs(el, len(prof.Groups))
				if err != nil {
					return nil, err
				}
				prof.Groups = append(prof.Groups, *g)
				group = &prof.Groups[len(prof.Groups)-1]
			case "transaction":
				if parent != "group" {
					return nil, ps.errf(off, "<transaction> belongs inside <group>%s", inside(parent))
				}
				tx, err := ps.txnAttrs(el)
				if err != nil {
					return nil, err
				}
				group.Transactions = append(group.Transactions, *tx)
				txn = &group.Transactions[len(group.Transactions)-1]
			case "flowop":
				if parent != "transaction" {
					return nil, ps.errf(off, "<flowop> belongs inside <transaction>%s", inside(parent))
				}
				f, err := ps.flowop(el)
				if err != nil {
					return nil, err
				}
				txn.Flowops = append(txn.Flowops, *f)
			default:
				return nil, ps.errf(off, "unknown element <%s> (a profile holds <profile>, <group>, <transaction> and <flowop>)", t.Name.Local)
			}
			stack = append(stack, name)
		case xml.EndElement:
			name := strings.ToLower(t.Name.Local)
			if len(stack) > 0 {
				stack = stack[:len(stack)-1]
			}
			switch name {
			case "transaction":
				if len(txn.Flowops) == 0 {
					return nil, &Error{File: ps.file, Pos: txn.Pos, Msg: "<transaction> has no <flowop>"}
				}
				txn = nil
			case "group":
				if len(group.Transactions) == 0 {
					return nil, &Error{File: ps.file, Pos: group.Pos, Msg: fmt.Sprintf("<group> %q has no <transaction>", group.Name)}
				}
				group = nil
			}
		case xml.CharData:
			if len(bytes.TrimSpace(t)) > 0 {
				return nil, ps.errf(off+firstNonSpace(t), "unexpected text %q (only elements belong in a profile)", clip(strings.TrimSpace(string(t)), 20))
			}
		case xml.Comment, xml.ProcInst, xml.Directive:
			// <?xml ...?>, comments and a DOCTYPE are ignored
		}
	}
	if prof == nil {
		return nil, &Error{File: ps.file, Pos: Pos{1, 1}, Msg: "no <profile> element found"}
	}
	if len(prof.Groups) == 0 {
		return nil, &Error{File: ps.file, Pos: Pos{1, 1}, Msg: fmt.Sprintf("<profile> %q has no <group>", prof.Name)}
	}
	if err := ps.validate(prof); err != nil {
		return nil, err
	}
	prof.Warnings = ps.warns
	return prof, nil
}

func inside(parent string) string {
	if parent == "" {
		return " (found at the top level)"
	}
	return fmt.Sprintf(" (found inside <%s>)", parent)
}

func firstNonSpace(b []byte) int {
	for i, c := range b {
		if c != ' ' && c != '\t' && c != '\n' && c != '\r' {
			return i
		}
	}
	return 0
}

func clip(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n]) + "..."
}

// expand resolves a value that starts with $ (the whole value names a
// variable: $h or ${h}).
func (ps *parser) expand(v string, off int) (string, error) {
	if !strings.HasPrefix(v, "$") {
		return v, nil
	}
	name := v[1:]
	if strings.HasPrefix(name, "{") && strings.HasSuffix(name, "}") {
		name = name[1 : len(name)-1]
	}
	if name == "" || strings.ContainsAny(name, " \t$={}") {
		return "", ps.errf(off, "bad variable reference %q", v)
	}
	val, ok := ps.vars(name)
	if !ok {
		return "", ps.errf(off, "variable $%s is not set (set it in the environment or with --var %s=VALUE)", name, name)
	}
	return strings.TrimSpace(val), nil
}

func (ps *parser) profileAttrs(el element) (*Profile, error) {
	p := &Profile{Name: "netload"}
	for _, a := range el.attrs {
		switch strings.ToLower(a.name) {
		case "name":
			v, err := ps.expand(a.value, a.valOff)
			if err != nil {
				return nil, err
			}
			p.Name = v
		default:
			return nil, ps.errf(a.nameOff, "unknown attribute %q on <profile> (it takes name)", a.name)
		}
	}
	return p, nil
}

func (ps *parser) groupAttrs(el element, idx int) (*Group, error) {
	g := &Group{Name: fmt.Sprintf("Group%d", idx), Pos: ps.pos(el.off)}
	seen := ""
	for _, a := range el.attrs {
		key := strings.ToLower(a.name)
		switch key {
		case "name":
			v, err := ps.expand(a.value, a.valOff)
			if err != nil {
				return nil, err
			}
			g.Name = v
		case "nthreads", "nprocs":
			if seen != "" {
				return nil, ps.errf(a.nameOff, "<group> has both %s and %s; give one", seen, key)
			}
			seen = key
			v, err := ps.expand(a.value, a.valOff)
			if err != nil {
				return nil, err
			}
			n, err := parseCount(v)
			if err != nil {
				return nil, ps.errf(a.valOff, "%s: %v", key, err)
			}
			if n < 1 {
				return nil, ps.errf(a.valOff, "%s must be at least 1, got %d", key, n)
			}
			if n > MaxStrands {
				return nil, ps.errf(a.valOff, "%s=%d is more than netload's limit of %d", key, n, MaxStrands)
			}
			g.Strands = int(n)
			g.Procs = key == "nprocs"
		default:
			return nil, ps.errf(a.nameOff, "unknown attribute %q on <group> (it takes nthreads or nprocs, and name)", a.name)
		}
	}
	if seen == "" {
		return nil, ps.errf(el.off, "<group> needs nthreads or nprocs")
	}
	return g, nil
}

func (ps *parser) txnAttrs(el element) (*Transaction, error) {
	t := &Transaction{Pos: ps.pos(el.off)}
	var haveIter, haveDur bool
	for _, a := range el.attrs {
		key := strings.ToLower(a.name)
		v, err := ps.expand(a.value, a.valOff)
		if err != nil {
			return nil, err
		}
		switch key {
		case "iterations":
			n, err := parseCount(v)
			if err != nil {
				return nil, ps.errf(a.valOff, "iterations: %v", err)
			}
			if n < 1 {
				return nil, ps.errf(a.valOff, "iterations must be at least 1, got %d", n)
			}
			t.Iterations = n
			haveIter = true
		case "duration":
			d, err := ParseTime(v)
			if err != nil {
				return nil, ps.errf(a.valOff, "duration: %v", err)
			}
			if d <= 0 {
				return nil, ps.errf(a.valOff, "duration must be positive, got %q", v)
			}
			t.Duration = d
			haveDur = true
		case "rate":
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
				return nil, ps.errf(a.valOff, "rate: %q is not a number", v)
			}
			if f <= 0 {
				return nil, ps.errf(a.valOff, "rate must be positive, got %q", v)
			}
			t.Rate = f
		case "iteration":
			return nil, ps.errf(a.nameOff, "unknown attribute \"iteration\" on <transaction>; did you mean iterations?")
		default:
			return nil, ps.errf(a.nameOff, "unknown attribute %q on <transaction> (it takes iterations, duration and rate)", a.name)
		}
	}
	if haveIter && haveDur {
		return nil, ps.errf(el.off, "<transaction> has both iterations and duration; give one")
	}
	if !haveIter && !haveDur {
		t.Iterations = 1 // uperf's default
	}
	return t, nil
}

// ccName is a Linux congestion control name (TCP_CA_NAME_MAX is 16 with the NUL).
var ccName = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,14}$`)

// option names netload knows from uperf but does not implement.
var unsupportedOptions = map[string]string{
	"localhost":    "binding to a local address",
	"repeat":       "the UDP inner loop",
	"batch_size":   "sendmmsg/recvmmsg batching",
	"non_blocking": "non-blocking sockets",
	"encaps":       "SCTP over UDP",
	"engine":       "SSL",
	"cipher":       "SSL",
	"method":       "SSL",
	"dir":          "sendfile",
	"nfiles":       "sendfile",
	"idle_timeout": "idle timeouts",
}

var unsupportedTypes = map[string]bool{"sendfile": true, "sendfilev": true, "redv": true, "sendto": true}

func knownOption(k string) bool {
	for _, sp := range Flowops {
		if sp.Op.Takes(k) {
			return true
		}
	}
	return false
}

func (ps *parser) flowop(el element) (*Flowop, error) {
	f := &Flowop{Count: 1, Conn: -1, Pos: ps.pos(el.off)}
	var opts *attr
	haveType := false
	for i := range el.attrs {
		a := &el.attrs[i]
		switch strings.ToLower(a.name) {
		case "type":
			v, err := ps.expand(a.value, a.valOff)
			if err != nil {
				return nil, err
			}
			v = strings.ToLower(strings.TrimSpace(v))
			sp, ok := SpecOf(v)
			if !ok {
				if unsupportedTypes[v] {
					return nil, ps.errf(a.valOff, "flowop type %q is not supported by netload (see README: unsupported uperf features)", v)
				}
				return nil, ps.errf(a.valOff, "unknown flowop type %q (netload knows %s)", v, flowopNames())
			}
			f.Type = sp.Op
			haveType = true
		case "options":
			opts = a
		case "name":
			// uperf ignores a flowop name; so do we
		default:
			return nil, ps.errf(a.nameOff, "unknown attribute %q on <flowop> (it takes type and options)", a.name)
		}
	}
	if !haveType {
		return nil, ps.errf(el.off, "<flowop> needs a type")
	}
	if opts != nil {
		if err := ps.options(f, opts); err != nil {
			return nil, err
		}
	}
	switch f.Type.spec().Needs {
	case "size":
		if f.Size == 0 {
			return nil, ps.errf(el.off, "flowop %s needs size=", f.Type)
		}
	case "duration":
		if f.Duration == 0 {
			return nil, ps.errf(el.off, "flowop %s needs duration=", f.Type)
		}
	}
	return f, nil
}

// optToken is one "k=v" or "flag" word of an options attribute.
type optToken struct {
	text string
	off  int
}

// splitOptions splits the options value into words; offsets come from
// the raw text when it lines up with the decoded value.
func splitOptions(a *attr) []optToken {
	dec := strings.Fields(a.value)
	var raw []optToken
	i := 0
	r := a.raw
	for i < len(r) {
		for i < len(r) && isSpace(r[i]) {
			i++
		}
		j := i
		for j < len(r) && !isSpace(r[j]) {
			j++
		}
		if j > i {
			raw = append(raw, optToken{r[i:j], a.valOff + i})
		}
		i = j
	}
	out := make([]optToken, len(dec))
	for k, w := range dec {
		out[k] = optToken{w, a.valOff}
		if len(raw) == len(dec) {
			out[k].off = raw[k].off
		}
	}
	return out
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func (ps *parser) options(f *Flowop, a *attr) error {
	seen := map[string]bool{}
	for _, tok := range splitOptions(a) {
		key, val, hasVal := strings.Cut(tok.text, "=")
		key = strings.ToLower(key)
		valOff := tok.off + len(key) + 1
		if strings.HasPrefix(key, "sctp_") {
			return ps.errf(tok.off, "option %q is not supported by netload (SCTP)", key)
		}
		if why, ok := unsupportedOptions[key]; ok {
			return ps.errf(tok.off, "option %q is not supported by netload (%s)", key, why)
		}
		if !knownOption(key) {
			return ps.errf(tok.off, "unknown option %q", tok.text)
		}
		if !f.Type.Takes(key) {
			return ps.errf(tok.off, "option %q does not apply to flowop %s", key, f.Type)
		}
		if seen[key] {
			return ps.errf(tok.off, "option %q given twice", key)
		}
		seen[key] = true
		flag := key == "tcp_nodelay" || key == "busy" || key == "idle" || key == "canfail"
		if flag {
			if hasVal {
				return ps.errf(tok.off, "option %q takes no value", key)
			}
		} else if !hasVal || val == "" {
			return ps.errf(tok.off, "option %q needs a value (%s=...)", key, key)
		}
		if hasVal {
			v, err := ps.expand(val, valOff)
			if err != nil {
				return err
			}
			val = v
		}
		bad := func(format string, args ...any) error {
			return ps.errf(valOff, "option %s: %s", key, fmt.Sprintf(format, args...))
		}
		switch key {
		case "size", "rsize", "wndsz":
			if strings.HasPrefix(strings.ToLower(val), "rand(") {
				return bad("random sizes (rand(min,max)) are not supported by netload")
			}
			n, err := ParseSize(val)
			if err != nil {
				return bad("%v", err)
			}
			if n <= 0 {
				return bad("must be positive, got %q", val)
			}
			if n > MaxSize {
				return bad("%q is more than netload's limit of 1 GiB", val)
			}
			switch key {
			case "size":
				f.Size = n
			case "rsize":
				f.RSize = n
			default:
				f.WndSz = n
			}
		case "count":
			n, err := parseCount(val)
			if err != nil {
				return bad("%v", err)
			}
			if n < 1 || n > MaxCount {
				return bad("must be between 1 and %d, got %q", MaxCount, val)
			}
			f.Count = n
		case "conn":
			n, err := strconv.Atoi(val)
			if err != nil || n < 1 || n > MaxConnID {
				return bad("must be a whole number from 1 to %d, got %q", MaxConnID, val)
			}
			f.Conn = n
		case "port":
			n, err := strconv.Atoi(val)
			if err != nil || n < 1 || n > 65535 {
				return bad("must be a port number from 1 to 65535, got %q", val)
			}
			f.Port = n
		case "remotehost":
			f.RemoteHost = val
		case "protocol":
			switch p := strings.ToLower(val); p {
			case "tcp", "udp":
				f.Protocol = p
			case "ssl", "sctp", "vsock", "rds":
				return bad("protocol %q is not supported by netload (tcp and udp are)", p)
			default:
				return bad("unknown protocol %q (tcp or udp)", val)
			}
		case "tcp_nodelay":
			f.NoDelay = true
		case "cc":
			if !ccName.MatchString(val) {
				return bad("%q is not a congestion control name (like cubic or bbr)", val)
			}
			f.CC = val
		case "stack", "bblog":
			// uperf sets these only where FreeBSD's TCP_FUNCTION_BLK and
			// TCP_LOG exist and warns elsewhere; Linux has neither
			ps.warnf(tok.off, "option %s is ignored: it is a FreeBSD TCP option, and uperf ignores it on Linux too", key)
			continue
		case "busy":
			f.Busy = true
		case "idle":
			f.Busy = false
		case "canfail":
			f.CanFail = true
		case "duration", "timeout":
			d, err := ParseTime(val)
			if err != nil {
				return bad("%v", err)
			}
			if d <= 0 {
				return bad("must be positive, got %q", val)
			}
			if key == "duration" {
				if f.Type != OpThink {
					// uperf parses duration= on every flowop but only think uses it
					ps.warnf(tok.off, "option duration on flowop %s is ignored, as uperf ignores it (use a timed transaction)", f.Type)
					continue
				}
				f.Duration = d
			} else {
				f.Timeout = d
			}
		}
	}
	if seen["busy"] && seen["idle"] {
		return ps.errf(a.valOff, "options busy and idle exclude each other")
	}
	return nil
}

// validate checks what needs the whole profile: connections used before
// they are opened, UDP limits, one remote host.
func (ps *parser) validate(p *Profile) error {
	total := 0
	for gi := range p.Groups {
		g := &p.Groups[gi]
		total += g.Strands
		if total > MaxStrands {
			return &Error{File: ps.file, Pos: g.Pos, Msg: fmt.Sprintf("the profile asks for more than %d strands in all", MaxStrands)}
		}
		open := map[int]string{}   // conn id -> protocol
		hostOf := map[int]string{} // conn id -> remotehost ("" = the default server)
		last := -1                 // most recently opened conn
		for ti := range g.Transactions {
			t := &g.Transactions[ti]
			for fi := range t.Flowops {
				f := &t.Flowops[fi]
				switch f.Type {
				case OpConnect, OpAccept:
					if f.Conn < 0 {
						f.Conn = 0
					}
					if f.Protocol == "" {
						f.Protocol = "tcp"
					}
					if f.Protocol == "udp" {
						if f.Port != 0 && g.Strands > 1 {
							return &Error{File: ps.file, Pos: f.Pos, Msg: fmt.Sprintf("a UDP %s with a fixed port serves one strand; this group has %d", f.Type, g.Strands)}
						}
						if f.NoDelay {
							// uperf sets TCP_NODELAY only on TCP sockets and says nothing
							ps.warnf(posOff(ps, f.Pos), "option tcp_nodelay is ignored on protocol udp, as uperf ignores it")
							f.NoDelay = false
						}
					}
					open[f.Conn] = f.Protocol
					hostOf[f.Conn] = f.RemoteHost
					last = f.Conn
				case OpRead, OpWrite, OpDisconnect:
					if f.Conn < 0 {
						if last < 0 {
							return &Error{File: ps.file, Pos: f.Pos, Msg: fmt.Sprintf("flowop %s comes before any connect or accept in group %q", f.Type, g.Name)}
						}
						// as uperf: a flowop without conn= uses the anonymous connection
						// (a connect/accept without conn=) while it is open
						f.Conn = last
						if _, ok := open[0]; ok {
							f.Conn = 0
						}
					}
					proto, ok := open[f.Conn]
					if !ok {
						return &Error{File: ps.file, Pos: f.Pos, Msg: fmt.Sprintf("flowop %s uses connection %d, which no earlier connect or accept opens", f.Type, f.Conn)}
					}
					// an op goes to the host its connection goes to (a remotehost
					// written on disconnect is ignored, as before)
					f.RemoteHost = hostOf[f.Conn]
					if f.Type == OpDisconnect {
						delete(open, f.Conn)
						if last == f.Conn {
							last = -1
							for id := range open {
								if id > last {
									last = id
								}
							}
						}
						continue
					}
					f.Protocol = proto
					if proto == "udp" && (f.Size > MaxUDPSize || f.RSize > MaxUDPSize) {
						return &Error{File: ps.file, Pos: f.Pos, Msg: fmt.Sprintf("a UDP datagram holds at most %d bytes; size is %d", MaxUDPSize, max(f.Size, f.RSize))}
					}
				default:
					if f.Conn < 0 {
						f.Conn = 0
					}
				}
			}
		}
	}
	return nil
}

// posOff turns a position back into a byte offset (for warnings found after parsing).
func posOff(ps *parser, p Pos) int {
	if p.Line < 1 || p.Line > len(ps.lines) {
		return 0
	}
	off := ps.lines[p.Line-1]
	for c := 1; c < p.Col && off < len(ps.src); c++ {
		_, n := utf8.DecodeRune(ps.src[off:])
		off += n
	}
	return off
}
