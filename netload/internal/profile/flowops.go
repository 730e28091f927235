package profile

// Spec describes one flowop type. Flowops below is the only list of flowops
// in netload: the parser takes names, aliases and options from it, the
// server checks a received profile against it, and the engine binds one
// executor to each entry (engine.executors, checked against this table when
// the engine starts). Adding a flowop means one entry here and one executor.
type Spec struct {
	Op       Op
	Aliases  []string // other names uperf accepts for it
	Opposite Op       // what the peer runs (uperf's flowop_opposite)
	Moves    bool     // transfers payload bytes (needs size=)
	Opens    bool     // opens a connection (connect, accept)
	Closes   bool     // closes a connection
	Setup    bool     // only opens/closes or does nothing: not a measured phase on its own
	Options  []string // the options it takes
	Needs    string   // an option it cannot do without ("" = none)
}

var connOptions = []string{"remotehost", "port", "protocol", "tcp_nodelay", "wndsz", "conn", "canfail", "timeout", "cc", "stack", "bblog"}
var dataOptions = []string{"size", "rsize", "count", "conn", "canfail", "timeout", "duration"}

// Flowops is the flowop table.
var Flowops = []Spec{
	{Op: OpAccept, Opposite: OpConnect, Opens: true, Setup: true, Options: connOptions},
	{Op: OpConnect, Opposite: OpAccept, Opens: true, Setup: true, Options: connOptions},
	{Op: OpRead, Aliases: []string{"recv"}, Opposite: OpWrite, Moves: true, Options: dataOptions, Needs: "size"},
	{Op: OpWrite, Aliases: []string{"send"}, Opposite: OpRead, Moves: true, Options: dataOptions, Needs: "size"},
	{Op: OpDisconnect, Opposite: OpDisconnect, Closes: true, Setup: true, Options: []string{"conn", "canfail", "remotehost", "protocol"}},
	{Op: OpThink, Opposite: OpThink, Options: []string{"duration", "busy", "idle", "count"}, Needs: "duration"},
	{Op: OpNop, Opposite: OpNop, Setup: true, Options: []string{"count", "duration"}},
}

var specByName = func() map[string]*Spec {
	m := map[string]*Spec{}
	for i := range Flowops {
		s := &Flowops[i]
		m[string(s.Op)] = s
		for _, a := range s.Aliases {
			m[a] = s
		}
	}
	return m
}()

var optionSets = func() map[Op]map[string]bool {
	m := map[Op]map[string]bool{}
	for _, s := range Flowops {
		m[s.Op] = map[string]bool{}
		for _, o := range s.Options {
			m[s.Op][o] = true
		}
	}
	return m
}()

// SpecOf looks a flowop up by name or alias (lower case).
func SpecOf(name string) (*Spec, bool) {
	s, ok := specByName[name]
	return s, ok
}

// Known reports whether o is a flowop of the table (a profile received
// over the network is checked with it).
func (o Op) Known() bool {
	s, ok := specByName[string(o)]
	return ok && s.Op == o
}

// Takes reports whether flowop o accepts option name.
func (o Op) Takes(name string) bool { return optionSets[o][name] }

func (o Op) spec() *Spec { return specByName[string(o)] }

// Opposite is the op the peer runs for o.
func (o Op) Opposite() Op {
	if s := o.spec(); s != nil {
		return s.Opposite
	}
	return o
}

// Moves reports whether the op transfers payload bytes.
func (o Op) Moves() bool { s := o.spec(); return s != nil && s.Moves }

// Opens reports whether the op opens a connection.
func (o Op) Opens() bool { s := o.spec(); return s != nil && s.Opens }

// names lists the table's names and aliases, for error messages.
func flowopNames() string {
	out := ""
	for i, s := range Flowops {
		if i > 0 {
			out += ", "
		}
		out += string(s.Op)
		for _, a := range s.Aliases {
			out += ", " + a
		}
	}
	return out
}
