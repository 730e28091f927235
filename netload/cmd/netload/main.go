// Command netload is a uperf-compatible network load generator.
//
//	netload serve [--listen ADDR:PORT]
//	netload run PROFILE.xml --remote ADDR
//	netload run --workload rr1c-200x1000 --users 10 --duration 30s --remote ADDR
//
// See README.md for the profile language, the report and the exit codes.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"kvmtune/netload/internal/engine"
	"kvmtune/netload/internal/profile"
	"kvmtune/netload/internal/report"
)

// Exit codes.
const (
	exitOK      = 0
	exitRun     = 1 // the run started but failed (partial results printed)
	exitUsage   = 2 // bad command line or profile
	exitConnect = 3 // cannot reach the server
	exitSetup   = 4 // the server (or this side) refused the run
	exitPeer    = 5 // the peer died or hung during the run
)

// DefaultPort is the control port, as uperf's master port.
const DefaultPort = 20000

// TokenEnv holds the shared secret when --token is not given (on both
// sides), so that it stays out of process listings.
const TokenEnv = "NETLOAD_TOKEN"

func main() {
	// NETLOAD_CPUPROFILE=FILE writes a Go CPU profile (for netload's own tuning)
	if path := os.Getenv("NETLOAD_CPUPROFILE"); path != "" {
		if f, err := os.Create(path); err == nil {
			if pprof.StartCPUProfile(f) == nil {
				code := realMain(os.Args[1:], os.Stdout, os.Stderr)
				pprof.StopCPUProfile()
				f.Close()
				os.Exit(code)
			}
		}
	}
	os.Exit(realMain(os.Args[1:], os.Stdout, os.Stderr))
}

func realMain(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return exitUsage
	}
	switch args[0] {
	case "serve", "server", "-s":
		return cmdServe(args[1:], stdout, stderr)
	case "run":
		return cmdRun(args[1:], stdout, stderr)
	case "workloads":
		return cmdWorkloads(stdout)
	case "profile":
		return cmdProfile(args[1:], stdout, stderr)
	case "version", "--version", "-V":
		fmt.Fprintf(stdout, "netload %s\n", engine.Version)
		return exitOK
	case "help", "-h", "--help":
		usage(stdout)
		return exitOK
	}
	fmt.Fprintf(stderr, "netload: unknown command %q\n", args[0])
	usage(stderr)
	return exitUsage
}

func usage(w io.Writer) {
	fmt.Fprint(w, `usage:
  netload serve [--listen ADDR:PORT] [--once]          serve runs (default 127.0.0.1:20000;
                                                       beyond loopback only with --token T)
  netload run PROFILE.xml --remote HOST[:PORT] [opts]   run a uperf profile
  netload run PROFILE.xml [opts]                        its remotehost(s): one netload serve per host
  netload run --workload NAME[--USERS] [--users N] [--duration 30s] --remote HOST[:PORT]
  netload workloads                                    list the built-in workloads
  netload profile PROFILE.xml | --workload NAME        check a profile, print it resolved
  netload version

run options: --var K=V (repeatable), --iterations N, --interval 1s, --json, -o FILE,
             --stream FILE, --peer-timeout 10s, --connect-timeout 5s, --drain 1s
exit codes: 0 ok, 1 run failed, 2 usage/profile, 3 cannot connect, 4 refused, 5 peer died/hung
`)
}

type varFlags map[string]string

func (v varFlags) String() string { return "" }
func (v varFlags) Set(s string) error {
	k, val, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("want K=V, got %q", s)
	}
	v[k] = val
	return nil
}

func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// parseArgs lets flags and the one positional argument come in any order.
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

func cmdServe(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("serve", stderr)
	listen := fs.String("listen", fmt.Sprintf("127.0.0.1:%d", DefaultPort), "control address to listen on (loopback unless told otherwise; :PORT means every address)")
	token := fs.String("token", os.Getenv(TokenEnv), "shared secret a client must send (default $"+TokenEnv+"; empty = none)")
	maxSessions := fs.Int("max-sessions", 8, "runs served at once; more are refused")
	maxPending := fs.Int("max-pending", 256, "connections still owing their hello; past it the oldest is closed")
	maxProfile := fs.Int("max-profile-bytes", 1<<20, "largest hello (it carries the profile) a client may send")
	maxRunMem := fs.String("max-run-memory", profile.FormatSize(engine.DefaultMaxRunMemory), "most memory one run may make the server hold (message buffers and strands)")
	maxMem := fs.String("max-memory", profile.FormatSize(engine.DefaultMaxMemory), "most memory the runs served at once may make the server hold")
	once := fs.Bool("once", false, "exit after serving one run")
	quiet := fs.Bool("q", false, "do not log sessions")
	peerTimeout := fs.Duration("peer-timeout", 10*time.Second, "end a session when the client is silent this long")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return exitUsage
	}
	if len(pos) > 0 {
		fmt.Fprintf(stderr, "netload serve: unexpected argument %q\n", pos[0])
		return exitUsage
	}
	if *maxSessions < 1 || *maxPending < 1 || *maxProfile < 1024 {
		fmt.Fprintln(stderr, "netload serve: --max-sessions and --max-pending must be at least 1, --max-profile-bytes at least 1024")
		return exitUsage
	}
	var mem [2]int64
	for i, o := range []struct{ name, val string }{{"max-run-memory", *maxRunMem}, {"max-memory", *maxMem}} {
		n, err := profile.ParseSize(o.val)
		if err != nil || n < 1<<20 {
			fmt.Fprintf(stderr, "netload serve: --%s %q: want a size of at least 1M (uperf units: 256M, 1G)\n", o.name, o.val)
			return exitUsage
		}
		mem[i] = n
	}
	if mem[0] > mem[1] {
		fmt.Fprintln(stderr, "netload serve: --max-run-memory is more than --max-memory: such a run could never start")
		return exitUsage
	}
	addr := *listen
	if !strings.Contains(addr, ":") {
		addr = net.JoinHostPort(addr, strconv.Itoa(DefaultPort))
	}
	srv, err := engine.Listen(addr)
	if err != nil {
		fmt.Fprintf(stderr, "netload serve: %v\n", err)
		return exitSetup
	}
	// anyone who can reach a port beyond loopback could otherwise run any
	// profile here: such a server needs a token (where it listens is known
	// only once it does: a name, or :PORT, which means every address)
	if ip := srv.Addr().(*net.TCPAddr).IP; *token == "" && !ip.IsLoopback() {
		srv.Close()
		fmt.Fprintf(stderr, "netload serve: --listen %s is not a loopback address: give a token (--token T or $%s), which clients must send\n", *listen, TokenEnv)
		return exitUsage
	}
	srv.PeerTimeout = *peerTimeout
	srv.Token = *token
	srv.MaxSessions, srv.MaxPending, srv.MaxProfileBytes = *maxSessions, *maxPending, *maxProfile
	srv.MaxRunMemory, srv.MaxMemory = mem[0], mem[1]
	srv.Once = *once
	if !*quiet {
		srv.Logf = func(format string, a ...any) {
			fmt.Fprintf(stderr, "%s netload serve: %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, a...))
		}
	}
	fmt.Fprintf(stdout, "netload %s serving on %s\n", engine.Version, srv.Addr())
	if f, ok := stdout.(*os.File); ok {
		f.Sync()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := srv.Serve(ctx); err != nil {
		fmt.Fprintf(stderr, "netload serve: %v\n", err)
		return exitRun
	}
	return exitOK
}

// drainOpt maps --drain to RunConfig.Drain, where 0 means the default and a
// negative value means no drain limit.
func drainOpt(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// remoteAddr adds the default port when ADDR has none.
func remoteAddr(s string) (string, error) {
	if s == "" {
		return "", errors.New("no remote: give --remote HOST[:PORT] or remotehost= in the profile")
	}
	if host, port, err := net.SplitHostPort(s); err == nil {
		if _, err := strconv.ParseUint(port, 10, 16); err != nil || host == "" {
			return "", fmt.Errorf("bad remote %q", s)
		}
		return s, nil
	}
	h := strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")
	if strings.ContainsAny(h, " /") {
		return "", fmt.Errorf("bad remote %q", s)
	}
	if strings.Count(h, ":") > 1 && net.ParseIP(h) == nil {
		return "", fmt.Errorf("bad remote %q: write an IPv6 address with a port as [ADDR]:PORT", s)
	}
	return net.JoinHostPort(h, strconv.Itoa(DefaultPort)), nil
}

// loaded is a profile ready to run.
type loaded struct {
	prof   *profile.Profile
	test   string
	source string
	xml    string
	vars   map[string]string
}

type profileOpts struct {
	workload   string
	users      int
	duration   time.Duration
	iterations int64
	vars       varFlags
	remoteHost string
}

func loadProfile(path string, o profileOpts) (*loaded, error) {
	vars := map[string]string{}
	if o.remoteHost != "" {
		vars["h"] = o.remoteHost
	}
	if o.users > 0 {
		vars["nprocs"] = strconv.Itoa(o.users)
		vars["nthreads"] = strconv.Itoa(o.users)
	}
	if o.duration > 0 {
		vars["duration"] = fmt.Sprintf("%dms", o.duration.Milliseconds())
	}
	for k, v := range o.vars {
		vars[k] = v
	}
	l := &loaded{vars: vars}
	var src []byte
	switch {
	case o.workload != "" && path != "":
		return nil, errors.New("give a profile file or --workload, not both")
	case o.workload != "":
		w, err := profile.ParseWorkloadName(o.workload)
		if err != nil {
			return nil, err
		}
		users := w.Users
		if o.users > 0 {
			if users > 0 && users != o.users {
				return nil, fmt.Errorf("workload %s names %d users but --users says %d", o.workload, users, o.users)
			}
			users = o.users
		}
		if users == 0 {
			users = 1
		}
		vars["nprocs"] = strconv.Itoa(users)
		if _, ok := vars["duration"]; !ok {
			vars["duration"] = "30s"
		}
		if _, ok := vars["h"]; !ok {
			vars["h"] = "127.0.0.1"
		}
		l.xml = w.XML()
		l.source = "builtin:" + w.Base
		l.test = w.TestName(users)
		src = []byte(l.xml)
	case path != "":
		b, err := readProfile(path)
		if err != nil {
			return nil, err
		}
		src = b
		l.xml = string(b)
		l.source = path
	default:
		return nil, errors.New("give a profile file or --workload NAME")
	}
	p, err := profile.Parse(src, l.source, profile.MapLookup(vars, profile.EnvLookup))
	if err != nil {
		return nil, err
	}
	for gi := range p.Groups {
		for ti := range p.Groups[gi].Transactions {
			t := &p.Groups[gi].Transactions[ti]
			if !t.Timed() {
				continue
			}
			if o.iterations > 0 {
				t.Duration, t.Iterations = 0, o.iterations
			} else if o.duration > 0 {
				t.Duration = o.duration
			}
		}
	}
	if l.test == "" {
		l.test = fmt.Sprintf("%s--%d", p.Name, p.Strands())
	}
	l.prof = p
	return l, nil
}

func readProfile(path string) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("profile %s: no such file", path)
		}
		return nil, fmt.Errorf("profile %s: %v", path, err)
	}
	if st.IsDir() {
		return nil, fmt.Errorf("profile %s: is a directory", path)
	}
	if st.Size() > 4<<20 {
		return nil, fmt.Errorf("profile %s: larger than 4 MiB", path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("profile %s: %v", path, err)
	}
	return b, nil
}

func cmdRun(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("run", stderr)
	var o profileOpts
	o.vars = varFlags{}
	fs.StringVar(&o.workload, "workload", "", "built-in workload (see `netload workloads`)")
	fs.IntVar(&o.users, "users", 0, "users (strands); sets $nprocs and $nthreads")
	fs.DurationVar(&o.duration, "duration", 0, "length of every timed transaction (default: the profile's; 30s for workloads)")
	fs.Int64Var(&o.iterations, "iterations", 0, "run every timed transaction this many times instead of for a duration")
	fs.Var(o.vars, "var", "set a profile variable K=V (repeatable; overrides the environment)")
	remote := fs.String("remote", "", "server HOST[:PORT] (default port 20000)")
	token := fs.String("token", os.Getenv(TokenEnv), "the server's shared secret (default $"+TokenEnv+")")
	interval := fs.Duration("interval", 0, "report throughput every interval (time series)")
	asJSON := fs.Bool("json", false, "print the JSON document instead of the text report")
	out := fs.String("o", "", "also write the JSON document to this file")
	stream := fs.String("stream", "", "write interval rows as JSON lines to this file while running")
	peerTimeout := fs.Duration("peer-timeout", 10*time.Second, "end the run when the server is silent this long")
	connectTimeout := fs.Duration("connect-timeout", 5*time.Second, "control connection timeout")
	stallTimeout := fs.Duration("stall-timeout", 60*time.Second, "end the run when no operation completes for this long")
	drain := fs.Duration("drain", engine.DefaultDrain, "after a timed transaction, how long the server waits for data still in flight before it reports it as undelivered (0: until its step grace, then fail)")
	quiet := fs.Bool("q", false, "no progress lines")
	ioMode := fs.String("io", engine.IOAuto, "data I/O: blocking (a thread per user, lowest latency), poll (Go's poller, many users) or auto")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return exitUsage
	}
	if len(pos) > 1 {
		fmt.Fprintf(stderr, "netload run: one profile at a time (got %s)\n", strings.Join(pos, " "))
		return exitUsage
	}
	path := ""
	if len(pos) == 1 {
		path = pos[0]
	}
	if o.users < 0 || o.iterations < 0 || o.duration < 0 || *interval < 0 || *drain < 0 {
		fmt.Fprintln(stderr, "netload run: --users, --iterations, --duration, --interval and --drain must not be negative")
		return exitUsage
	}
	if *remote != "" {
		host := *remote
		if h, _, err := net.SplitHostPort(*remote); err == nil {
			host = h
		}
		o.remoteHost = host
	}
	l, err := loadProfile(path, o)
	if err != nil {
		fmt.Fprintf(stderr, "netload: %v\n", err)
		return exitUsage
	}
	for _, w := range l.prof.Warnings {
		fmt.Fprintf(stderr, "netload: %s\n", w)
	}
	var remotes []engine.Remote
	addr := ""
	if hosts := l.prof.RemoteHosts(); len(hosts) > 1 {
		// one netload serve per remote host, all in one run (engine.Run)
		if *remote != "" {
			fmt.Fprintf(stderr, "netload: --remote names one server, but the profile names %d hosts (%s): start a netload serve on each\n", len(hosts), strings.Join(hosts, ", "))
			return exitUsage
		}
		for _, h := range hosts {
			a, err := remoteAddr(h)
			if err != nil {
				fmt.Fprintf(stderr, "netload: %s: remotehost %q: %v\n", l.source, h, err)
				return exitUsage
			}
			remotes = append(remotes, engine.Remote{Name: h, Addr: a})
		}
	} else {
		r := *remote
		if r == "" && len(hosts) == 1 {
			r = hosts[0]
		}
		a, err := remoteAddr(r)
		if err != nil {
			fmt.Fprintf(stderr, "netload: %v\n", err)
			return exitUsage
		}
		addr = a
	}

	var streamFile *os.File
	if *stream != "" {
		f, err := os.Create(*stream)
		if err != nil {
			fmt.Fprintf(stderr, "netload: %v\n", err)
			return exitUsage
		}
		defer f.Close()
		streamFile = f
	}
	cfg := engine.RunConfig{Remote: addr, Remotes: remotes, Token: *token, Profile: l.prof, Test: l.test, Source: l.source, XML: l.xml, Vars: l.vars,
		IOMode: *ioMode, Interval: *interval, PeerTimeout: *peerTimeout, ConnectTimeout: *connectTimeout, StallTimeout: *stallTimeout,
		Drain: drainOpt(*drain)}
	cfg.OnInterval = func(iv report.Interval) {
		if !*quiet && !*asJSON {
			fmt.Fprintln(stderr, report.IntervalLine(iv))
		}
		if streamFile != nil {
			b, _ := json.Marshal(struct {
				SchemaVersion int    `json:"schema_version"`
				Type          string `json:"type"`
				Test          string `json:"test"`
				report.Interval
			}{report.SchemaVersion, "interval", l.test, iv})
			streamFile.Write(append(b, '\n'))
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	doc, runErr := engine.Run(ctx, cfg)
	if *out != "" {
		b, err := doc.JSON()
		if err == nil {
			err = os.WriteFile(*out, b, 0o644)
		}
		if err != nil {
			fmt.Fprintf(stderr, "netload: writing %s: %v\n", *out, err)
		}
	}
	if *asJSON {
		b, err := doc.JSON()
		if err != nil {
			fmt.Fprintf(stderr, "netload: %v\n", err)
			return exitRun
		}
		stdout.Write(b)
	} else if runErr == nil || len(doc.Steps) > 0 {
		doc.WriteText(stdout)
	}
	if runErr != nil {
		fmt.Fprintf(stderr, "netload: error: %v\n", runErr)
		return exitCode(runErr)
	}
	return exitOK
}

// exitCode maps a run's error to the exit code.
func exitCode(runErr error) int {
	var re *engine.RunError
	if errors.As(runErr, &re) {
		switch re.Class {
		case engine.ClassConnect:
			return exitConnect
		case engine.ClassSetup:
			return exitSetup
		case engine.ClassPeer:
			return exitPeer
		case engine.ClassUsage, engine.ClassProfile:
			return exitUsage
		}
	}
	return exitRun
}

func cmdWorkloads(stdout io.Writer) int {
	fmt.Fprintln(stdout, "Built-in workloads (seed 002 matrix; add --USERS, e.g. rr1c-200x1000--10):")
	desc := map[string]string{}
	for _, n := range profile.SeedWorkloads {
		w, _ := profile.ParseWorkloadName(n)
		switch {
		case w.Kind == "rr":
			desc[n] = fmt.Sprintf("request/response: client writes %d B, server answers %d B", w.Request, w.Response)
		case w.Read:
			desc[n] = fmt.Sprintf("stream %d B messages toward the client (server writes)", w.Request)
		default:
			desc[n] = fmt.Sprintf("stream %d B messages away from the client (client writes)", w.Request)
		}
	}
	names := append([]string(nil), profile.SeedWorkloads...)
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(stdout, "  %-16s %s\n", n, desc[n])
	}
	fmt.Fprintf(stdout, "Users in the seed matrix: %v. Any rr1c-REQxRESP or str-read|writexSIZE works too.\n", profile.SeedUsers)
	return exitOK
}

func cmdProfile(args []string, stdout, stderr io.Writer) int {
	fs := newFlagSet("profile", stderr)
	var o profileOpts
	o.vars = varFlags{}
	fs.StringVar(&o.workload, "workload", "", "print this built-in workload's XML")
	fs.IntVar(&o.users, "users", 0, "users; sets $nprocs and $nthreads")
	fs.DurationVar(&o.duration, "duration", 0, "sets $duration")
	fs.Var(o.vars, "var", "set a profile variable K=V")
	xmlOnly := fs.Bool("xml", false, "print only the XML (workloads)")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return exitUsage
	}
	path := ""
	if len(pos) == 1 {
		path = pos[0]
	} else if len(pos) > 1 {
		fmt.Fprintln(stderr, "netload profile: one profile at a time")
		return exitUsage
	}
	if *xmlOnly && o.workload != "" {
		w, err := profile.ParseWorkloadName(o.workload)
		if err != nil {
			fmt.Fprintf(stderr, "netload: %v\n", err)
			return exitUsage
		}
		fmt.Fprint(stdout, w.XML())
		return exitOK
	}
	l, err := loadProfile(path, o)
	if err != nil {
		fmt.Fprintf(stderr, "netload: %v\n", err)
		return exitUsage
	}
	for _, w := range l.prof.Warnings {
		fmt.Fprintf(stderr, "netload: %s\n", w)
	}
	b, _ := json.MarshalIndent(l.prof, "", "  ")
	fmt.Fprintf(stdout, "%s\n", b)
	return exitOK
}
