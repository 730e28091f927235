package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var bin string

// The CLI tests run the real binary: exit codes, messages and resource
// limits are process-level behaviour.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "netload-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = filepath.Join(dir, "netload")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building netload: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

type result struct {
	code           int
	stdout, stderr string
	took           time.Duration
}

func runBin(t *testing.T, timeout time.Duration, args ...string) result {
	t.Helper()
	return runCmd(t, timeout, exec.Command(bin, args...))
}

func runCmd(t *testing.T, timeout time.Duration, cmd *exec.Cmd) result {
	t.Helper()
	var so, se bytes.Buffer
	cmd.Stdout, cmd.Stderr = &so, &se
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(timeout):
		cmd.Process.Kill()
		<-done
		t.Fatalf("%v did not finish within %v\nstdout:\n%s\nstderr:\n%s", cmd.Args, timeout, so.String(), se.String())
	}
	r := result{code: cmd.ProcessState.ExitCode(), stdout: so.String(), stderr: se.String(), took: time.Since(start)}
	if strings.Contains(r.stderr, "panic:") || strings.Contains(r.stderr, "goroutine ") {
		t.Fatalf("%v panicked:\n%s", cmd.Args, r.stderr)
	}
	return r
}

func freePort(t *testing.T) string {
	t.Helper()
	return freePortOn(t, "127.0.0.1")
}

func freePortOn(t *testing.T, ip string) string {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// server starts `netload serve` (optionally under a shell prefix such as a
// ulimit) and waits until it listens.
func server(t *testing.T, shellPrefix string, extra ...string) (*exec.Cmd, string) {
	t.Helper()
	cmd, addr, _ := serverOn(t, "127.0.0.1", shellPrefix, append([]string{"-q"}, extra...)...)
	return cmd, addr
}

// lockedBuffer is a server's stderr, read while it runs.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// serverOn starts `netload serve` on a free port of ip; its stderr (the
// session log unless extra has -q) comes back as it runs.
func serverOn(t *testing.T, ip, shellPrefix string, extra ...string) (*exec.Cmd, string, *lockedBuffer) {
	t.Helper()
	addr := freePortOn(t, ip)
	args := append([]string{"serve", "--listen", addr}, extra...)
	var cmd *exec.Cmd
	if shellPrefix != "" {
		cmd = exec.Command("sh", append([]string{"-c", shellPrefix + " && exec \"$0\" \"$@\"", bin}, args...)...)
	} else {
		cmd = exec.Command(bin, args...)
	}
	se := &lockedBuffer{}
	cmd.Stderr = se
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGCONT)
		cmd.Process.Kill()
		cmd.Wait()
	})
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return cmd, addr, se
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("server did not start: %s", se.String())
	return nil, "", nil
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestBadInput(t *testing.T) {
	good := `<profile name="p"><group nthreads="1"><transaction><flowop type="connect" options="remotehost=127.0.0.1"/></transaction></group></profile>`
	cases := []struct {
		name string
		args []string
		code int
		msg  string
	}{
		{"no arguments", nil, exitUsage, "usage:"},
		{"unknown command", []string{"frobnicate"}, exitUsage, `unknown command "frobnicate"`},
		{"missing profile", []string{"run", "/nonexistent/p.xml", "--remote", "127.0.0.1"}, exitUsage, "profile /nonexistent/p.xml: no such file"},
		{"profile is a directory", []string{"run", os.TempDir(), "--remote", "127.0.0.1"}, exitUsage, "is a directory"},
		{"malformed profile", []string{"run", writeFile(t, "m.xml", "<profile name=\"x\">\n  <group nthreads=\"1\">\n</profile>"), "--remote", "127.0.0.1"}, exitUsage, "m.xml:3:"},
		{"unknown flowop", []string{"run", writeFile(t, "u.xml", strings.Replace(good, `type="connect"`, `type="teleport"`, 1))}, exitUsage, `u.xml:1:66: unknown flowop type "teleport"`},
		{"unknown option", []string{"run", writeFile(t, "o.xml", strings.Replace(good, `remotehost=127.0.0.1`, `remotehost=127.0.0.1 turbo`, 1))}, exitUsage, `unknown option "turbo"`},
		{"zero size", []string{"run", writeFile(t, "z.xml", strings.Replace(good, `</transaction>`, `<flowop type="write" options="size=0"/></transaction>`, 1))}, exitUsage, "option size: must be positive"},
		{"negative size", []string{"run", writeFile(t, "n.xml", strings.Replace(good, `</transaction>`, `<flowop type="write" options="size=-1k"/></transaction>`, 1))}, exitUsage, "option size: must be positive"},
		{"unknown workload", []string{"run", "--workload", "rr9-1x1", "--remote", "127.0.0.1"}, exitUsage, "unknown workload"},
		{"negative users", []string{"run", "--workload", "rr1c-1x1", "--users", "-5", "--remote", "127.0.0.1"}, exitUsage, "must not be negative"},
		{"users disagree", []string{"run", "--workload", "rr1c-1x1--10", "--users", "5", "--remote", "127.0.0.1"}, exitUsage, "names 10 users but --users says 5"},
		{"bad flag", []string{"run", "--nosuchflag"}, exitUsage, "flag provided but not defined"},
		{"no profile at all", []string{"run", "--remote", "127.0.0.1"}, exitUsage, "give a profile file or --workload"},
		{"bad remote", []string{"run", "--workload", "rr1c-1x1", "--remote", "127.0.0.1:99999"}, exitUsage, "bad remote"},
		{"ambiguous ipv6 remote", []string{"run", "--workload", "rr1c-1x1", "--remote", "::1:20591"}, exitUsage, "[ADDR]:PORT"},
		{"unset variable", []string{"run", writeFile(t, "v.xml", strings.Replace(good, "127.0.0.1", "$netload_test_unset", 1))}, exitUsage, "variable $netload_test_unset is not set"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := runBin(t, 10*time.Second, c.args...)
			if r.code != c.code {
				t.Fatalf("exit %d, want %d\nstderr: %s", r.code, c.code, r.stderr)
			}
			if !strings.Contains(r.stderr, c.msg) {
				t.Fatalf("stderr %q does not mention %q", r.stderr, c.msg)
			}
		})
	}
}

func TestRefusedRemote(t *testing.T) {
	addr := freePort(t) // closed again: nothing listens
	r := runBin(t, 10*time.Second, "run", "--workload", "rr1c-1x1", "--duration", "1s", "--remote", addr)
	if r.code != exitConnect || !strings.Contains(r.stderr, "connection refused") {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
}

// In an empty network namespace 198.18.0.1 has no route: the connect
// fails at once and no packet leaves the namespace.
func TestUnreachableRemote(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for unshare -n")
	}
	if err := exec.Command("unshare", "-n", "true").Run(); err != nil {
		t.Skipf("unshare -n not available: %v", err)
	}
	r := runCmd(t, 20*time.Second, exec.Command("unshare", "-n", bin, "run", "--workload", "rr1c-1x1", "--duration", "1s", "--remote", "198.18.0.1", "--connect-timeout", "2s"))
	if r.code != exitConnect || !strings.Contains(r.stderr, "unreachable") {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
}

// 250 users against a server allowed 64 file descriptors: the server
// refuses with a clear message and the client exits with code 4.
func TestLowFileLimitOnServer(t *testing.T) {
	_, addr := server(t, "ulimit -n 64")
	r := runBin(t, 20*time.Second, "run", "--workload", "rr1c-1x1--250", "--duration", "1s", "--remote", addr)
	if r.code != exitSetup {
		t.Fatalf("exit %d, want %d\nstderr: %s", r.code, exitSetup, r.stderr)
	}
	for _, want := range []string{"server refused the run", "RLIMIT_NOFILE allows 64", "ulimit -n"} {
		if !strings.Contains(r.stderr, want) {
			t.Fatalf("stderr %q does not mention %q", r.stderr, want)
		}
	}
}

func TestLowFileLimitOnClient(t *testing.T) {
	_, addr := server(t, "")
	cmd := exec.Command("sh", "-c", `ulimit -n 64 && exec "$0" "$@"`, bin, "run", "--workload", "str-readx30k--250", "--duration", "1s", "--remote", addr)
	r := runCmd(t, 20*time.Second, cmd)
	if r.code != exitSetup || !strings.Contains(r.stderr, "the client needs about") {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
}

type doc struct {
	SchemaVersion int    `json:"schema_version"`
	Test          string `json:"test"`
	Summary       struct {
		Bytes        int64   `json:"bytes"`
		Transactions int64   `json:"transactions"`
		Errors       int64   `json:"errors"`
		DurationS    float64 `json:"duration_s"`
		TxnTime      struct {
			Count uint64 `json:"count"`
			P99   uint64 `json:"p99"`
		} `json:"txn_time_ns"`
	} `json:"summary"`
	CPU struct {
		Client struct {
			PerMB float64 `json:"process_cpu_s_per_mb"`
		} `json:"client"`
		Server struct {
			PerTxn float64 `json:"process_cpu_us_per_txn"`
		} `json:"server"`
	} `json:"cpu"`
	Intervals []struct {
		Bytes int64 `json:"bytes"`
	} `json:"intervals"`
	PeakRSS struct {
		Client int64 `json:"client"`
		Server int64 `json:"server"`
	} `json:"peak_rss_bytes"`
	Error *struct {
		Class   string `json:"class"`
		Message string `json:"message"`
	} `json:"error"`
}

func TestRunJSONAndText(t *testing.T) {
	_, addr := server(t, "")
	out := filepath.Join(t.TempDir(), "r.json")
	stream := filepath.Join(t.TempDir(), "s.jsonl")
	r := runBin(t, 30*time.Second, "run", "--workload", "rr1c-200x1000--4", "--duration", "600ms", "--remote", addr,
		"--interval", "200ms", "-o", out, "--stream", stream)
	if r.code != exitOK {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	for _, want := range []string{"rr1c-200x1000--4", "Txn2*", "Measured", "p99.9", "Run Statistics", "Difference(%)", "cpu-s/MB", "Peak memory"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("text report lacks %q:\n%s", want, r.stdout)
		}
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var d doc
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	if d.SchemaVersion != 1 || d.Test != "rr1c-200x1000--4" || d.Error != nil {
		t.Fatalf("document header %+v", d)
	}
	if d.Summary.Transactions == 0 || d.Summary.Bytes != d.Summary.Transactions*1200 || d.Summary.Errors != 0 {
		t.Fatalf("summary %+v", d.Summary)
	}
	if d.Summary.TxnTime.Count != uint64(d.Summary.Transactions) || d.Summary.TxnTime.P99 == 0 {
		t.Fatalf("transaction time %+v", d.Summary.TxnTime)
	}
	if d.CPU.Client.PerMB <= 0 || d.CPU.Server.PerTxn <= 0 || d.PeakRSS.Client <= 0 || d.PeakRSS.Server <= 0 {
		t.Fatalf("cpu/memory not reported: %+v %+v", d.CPU, d.PeakRSS)
	}
	if len(d.Intervals) < 2 {
		t.Fatalf("%d interval rows", len(d.Intervals))
	}
	lines, _ := os.ReadFile(stream)
	if n := strings.Count(string(lines), "\n"); n != len(d.Intervals) || !strings.Contains(string(lines), `"schema_version":1`) {
		t.Fatalf("stream has %d lines for %d intervals", n, len(d.Intervals))
	}
	// --json prints the same document on stdout
	r = runBin(t, 30*time.Second, "run", "--workload", "str-writex30k", "--iterations", "100", "--remote", addr, "--json")
	if r.code != exitOK {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	if err := json.Unmarshal([]byte(r.stdout), &d); err != nil || d.Summary.Bytes != 100*30720 {
		t.Fatalf("--json output: %v, bytes %d", err, d.Summary.Bytes)
	}
}

// The seed's 250-user cells run without errors.
func TestTwoHundredFiftyUsers(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	_, addr := server(t, "")
	for _, w := range []string{"rr1c-1x1--250", "str-readx30k--250"} {
		r := runBin(t, 60*time.Second, "run", "--workload", w, "--duration", "500ms", "--remote", addr, "--json")
		var d doc
		if err := json.Unmarshal([]byte(r.stdout), &d); err != nil {
			t.Fatalf("%s: %v (exit %d, %s)", w, err, r.code, r.stderr)
		}
		if r.code != exitOK || d.Error != nil || d.Summary.Errors != 0 || d.Summary.Transactions < 250 {
			t.Fatalf("%s: exit %d, %+v, %s", w, r.code, d.Summary, r.stderr)
		}
	}
}

func TestKilledServer(t *testing.T) {
	cmd, addr := server(t, "")
	go func() {
		time.Sleep(800 * time.Millisecond)
		cmd.Process.Kill()
	}()
	r := runBin(t, 30*time.Second, "run", "--workload", "rr1c-1x1--2", "--duration", "60s", "--remote", addr, "--json")
	if r.code != exitPeer && r.code != exitRun {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	if r.took > 10*time.Second {
		t.Fatalf("run took %v after the server was killed", r.took)
	}
	var d doc
	if err := json.Unmarshal([]byte(r.stdout), &d); err != nil {
		t.Fatal(err)
	}
	if d.Error == nil || d.Summary.Transactions == 0 {
		t.Fatalf("want the partial measurement and an error, got %+v %+v", d.Summary, d.Error)
	}
}

func TestStoppedServer(t *testing.T) {
	cmd, addr := server(t, "")
	go func() {
		time.Sleep(800 * time.Millisecond)
		cmd.Process.Signal(syscall.SIGSTOP)
	}()
	r := runBin(t, 30*time.Second, "run", "--workload", "str-writex30k--2", "--duration", "60s", "--remote", addr, "--peer-timeout", "1s")
	if r.code != exitPeer {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	if !strings.Contains(r.stderr, "stopped answering") || r.took > 10*time.Second {
		t.Fatalf("took %v, stderr %q", r.took, r.stderr)
	}
	if !strings.Contains(r.stdout, "ERROR (peer)") {
		t.Fatalf("text report lacks the error:\n%s", r.stdout)
	}
}

func TestWorkloadsAndProfileCommands(t *testing.T) {
	r := runBin(t, 10*time.Second, "workloads")
	for _, w := range []string{"rr1c-1x1", "rr1c-200x1000", "rr1c-1000x30k", "str-readx30k", "str-writex30k"} {
		if !strings.Contains(r.stdout, w) {
			t.Errorf("workloads lacks %s", w)
		}
	}
	r = runBin(t, 10*time.Second, "profile", "--xml", "--workload", "rr1c-1000x30k")
	if r.code != 0 || !strings.Contains(r.stdout, `size=30k`) {
		t.Fatalf("profile --xml: %d %s", r.code, r.stdout)
	}
	r = runBin(t, 10*time.Second, "profile", "--workload", "str-readx30k--50", "--var", "h=198.18.0.2")
	if r.code != 0 || !strings.Contains(r.stdout, `"strands": 50`) || !strings.Contains(r.stdout, `198.18.0.2`) {
		t.Fatalf("profile: %d %s %s", r.code, r.stdout, r.stderr)
	}
	r = runBin(t, 10*time.Second, "version")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "netload ") {
		t.Fatal(r.stdout)
	}
}

// A client that hangs (stopped) is dropped by the server after its peer
// timeout, and the server takes the next run.
func TestServerDropsHungClient(t *testing.T) {
	addr := freePort(t)
	logPath := filepath.Join(t.TempDir(), "serve.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	srv := exec.Command(bin, "serve", "--listen", addr, "--peer-timeout", "1s")
	srv.Stderr = logf
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { srv.Process.Kill(); srv.Wait() }()
	for i := 0; i < 100; i++ {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	c := exec.Command(bin, "run", "--workload", "rr1c-1x1--2", "--duration", "60s", "--remote", addr, "-q")
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { c.Process.Signal(syscall.SIGCONT); c.Process.Kill(); c.Wait() }()
	time.Sleep(500 * time.Millisecond)
	c.Process.Signal(syscall.SIGSTOP)
	deadline := time.Now().Add(5 * time.Second)
	for {
		b, _ := os.ReadFile(logPath)
		if strings.Contains(string(b), "lost") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server did not drop the stopped client within 5 s:\n%s", b)
		}
		time.Sleep(100 * time.Millisecond)
	}
	r := runBin(t, 30*time.Second, "run", "--workload", "rr1c-1x1--2", "--iterations", "200", "--remote", addr, "--json")
	var d doc
	if err := json.Unmarshal([]byte(r.stdout), &d); err != nil || r.code != exitOK || d.Summary.Transactions != 400 {
		t.Fatalf("next run after a hung client: exit %d, %v, %+v, %s", r.code, err, d.Summary, r.stderr)
	}
}

func TestServeListensOnLoopbackByDefault(t *testing.T) {
	r := runBin(t, 5*time.Second, "serve", "-h")
	if !strings.Contains(r.stderr, `(default "127.0.0.1:20000")`) {
		t.Fatalf("serve's default listen address is not loopback:\n%s", r.stderr)
	}
}

func TestTokenFromFlagOrEnvironment(t *testing.T) {
	_, addr := server(t, "", "--token", "letmein")
	r := runBin(t, 20*time.Second, "run", "--workload", "rr1c-1x1--1", "--iterations", "5", "--remote", addr, "-q")
	if r.code != exitSetup || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 || !strings.Contains(r.stderr, "needs a token") {
		t.Fatalf("no token: exit %d, stderr %q", r.code, r.stderr)
	}
	c := exec.Command(bin, "run", "--workload", "rr1c-1x1--1", "--iterations", "5", "--remote", addr, "-q")
	c.Env = append(os.Environ(), "NETLOAD_TOKEN=letmein")
	if r := runCmd(t, 20*time.Second, c); r.code != exitOK {
		t.Fatalf("token from the environment: exit %d, %s", r.code, r.stderr)
	}
	if r := runBin(t, 20*time.Second, "run", "--workload", "rr1c-1x1--1", "--iterations", "5", "--remote", addr, "-q", "--token", "letmein"); r.code != exitOK {
		t.Fatalf("token flag: exit %d, %s", r.code, r.stderr)
	}
}

// Every profile in testdata/ uses a uperf feature the way uperf's shipped
// profiles do; each runs unchanged against a real `netload serve`, with
// uperf's variables taken from the environment.
func TestUperfFeatureProfilesRunAgainstARealServer(t *testing.T) {
	files, err := filepath.Glob("../../testdata/*.xml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no testdata profiles: %v", err)
	}
	_, addr := server(t, "")
	_, addr2, _ := serverOn(t, "127.0.0.2", "", "-q")
	host, _, _ := net.SplitHostPort(addr)
	type summary struct {
		Transactions int64   `json:"transactions"`
		Errors       int64   `json:"errors"`
		ServerErrors int64   `json:"server_errors"`
		DiffPct      float64 `json:"bytes_difference_pct"`
	}
	type share struct {
		Remotehost string `json:"remotehost"`
		Bytes      int64  `json:"bytes"`
		Errors     int64  `json:"errors"`
	}
	type document struct {
		Summary summary `json:"summary"`
		Servers []share `json:"servers"`
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			args := []string{"run", f, "--json", "-q", "--stall-timeout", "10s"}
			multi := strings.Contains(f, "two-hosts")
			if !multi {
				args = append(args, "--remote", addr)
			}
			c := exec.Command(bin, args...)
			// uperf's variables from the environment; $h1/$h2 are two servers
			c.Env = append(os.Environ(), "h="+host, "h1="+addr, "h2="+addr2, "nthr=3", "iter=4", "proto=tcp")
			r := runCmd(t, 60*time.Second, c)
			if r.code != exitOK {
				t.Fatalf("exit %d: %s", r.code, r.stderr)
			}
			var doc document
			if err := json.Unmarshal([]byte(r.stdout), &doc); err != nil {
				t.Fatal(err)
			}
			if doc.Summary.Errors != 0 || doc.Summary.ServerErrors != 0 || doc.Summary.DiffPct != 0 || doc.Summary.Transactions == 0 {
				t.Fatalf("summary %+v", doc.Summary)
			}
			if multi {
				// one document; each host's server and its share of the bytes
				if len(doc.Servers) != 2 || doc.Servers[0].Remotehost != addr || doc.Servers[1].Remotehost != addr2 {
					t.Fatalf("servers %+v", doc.Servers)
				}
				for _, sv := range doc.Servers {
					if sv.Bytes == 0 || sv.Errors != 0 {
						t.Fatalf("server %+v", sv)
					}
				}
			} else if len(doc.Servers) != 0 {
				t.Fatalf("a one-host run lists servers: %+v", doc.Servers)
			}
			switch filepath.Base(f) {
			case "ignored-options.xml", "tcp-options.xml":
				if strings.Count(r.stderr, "warning:") != 2 {
					t.Fatalf("want two warnings, got:\n%s", r.stderr)
				}
			}
		})
	}
}

// One strand talks to two `netload serve` (127.0.0.1 and 127.0.0.2): the
// text report has each host's share, and both servers end the run cleanly.
func TestOneStrandTalksToTwoServers(t *testing.T) {
	_, a1, log1 := serverOn(t, "127.0.0.1", "")
	_, a2, log2 := serverOn(t, "127.0.0.2", "")
	c := exec.Command(bin, "run", "../../testdata/one-strand-two-hosts.xml", "-q")
	c.Env = append(os.Environ(), "h1="+a1, "h2="+a2)
	r := runCmd(t, 60*time.Second, c)
	if r.code != exitOK || r.stderr != "" {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	// host 1: 2 strands x (100 x 120 B + 30 x 1 KiB); host 2: 2 x 100 x 350 B
	for _, want := range []string{"server " + a1 + "," + a2, " " + a1 + " ", "83.44KB", " " + a2 + " ", "68.36KB", "Difference(%)                     0.00%"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("no %q in the report:\n%s", want, r.stdout)
		}
	}
	for _, l := range []*lockedBuffer{log1, log2} {
		deadline := time.Now().Add(5 * time.Second)
		for !strings.Contains(l.String(), "run finished") && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if out := l.String(); !strings.Contains(out, "run finished") || strings.Contains(out, "interrupted") || strings.Contains(out, "reached") || strings.Contains(out, "lost") {
			t.Errorf("server log:\n%s", out)
		}
	}
}

// A remote host nobody serves ends the run with one line naming it (exit 3);
// --remote cannot stand for several hosts.
func TestUnreachableSecondHost(t *testing.T) {
	_, a1 := server(t, "")
	closed := freePortOn(t, "127.0.0.2")
	c := exec.Command(bin, "run", "../../testdata/one-strand-two-hosts.xml", "-q")
	c.Env = append(os.Environ(), "h1="+a1, "h2="+closed)
	r := runCmd(t, 30*time.Second, c)
	if r.code != exitConnect || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 || !strings.Contains(r.stderr, "remotehost "+closed) {
		t.Fatalf("exit %d: %q", r.code, r.stderr)
	}
	c = exec.Command(bin, "run", "../../testdata/one-strand-two-hosts.xml", "--remote", a1)
	c.Env = append(os.Environ(), "h1="+a1, "h2="+closed)
	if r := runCmd(t, 10*time.Second, c); r.code != exitUsage || !strings.Contains(r.stderr, "start a netload serve on each") {
		t.Fatalf("--remote with two hosts: exit %d: %s", r.code, r.stderr)
	}
}
