package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"kvmtune/netload/internal/engine"
)

// withoutToken is the environment with no $NETLOAD_TOKEN.
func withoutToken() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, TokenEnv+"=") {
			env = append(env, kv)
		}
	}
	return env
}

// A server reachable beyond loopback must have a token: without one, serve
// refuses to start, in one line.
func TestServeBeyondLoopbackNeedsAToken(t *testing.T) {
	for _, listen := range []string{"0.0.0.0:0", ":0"} {
		c := exec.Command(bin, "serve", "--listen", listen, "-q")
		c.Env = withoutToken()
		r := runCmd(t, 5*time.Second, c)
		if r.code != exitUsage || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 ||
			!strings.Contains(r.stderr, "is not a loopback address: give a token (--token T or $NETLOAD_TOKEN)") {
			t.Fatalf("--listen %s without a token: exit %d, stderr %q", listen, r.code, r.stderr)
		}
		if strings.Contains(r.stdout, "serving") {
			t.Fatalf("--listen %s without a token said it serves: %q", listen, r.stdout)
		}
	}
	// with a token (flag or environment), and on loopback without one, it serves
	for _, tc := range []struct {
		args []string
		env  string
	}{
		{[]string{"--listen", "0.0.0.0:0", "--token", "t0ken"}, ""},
		{[]string{"--listen", "0.0.0.0:0"}, TokenEnv + "=t0ken"},
		{[]string{"--listen", "localhost:0"}, ""},
	} {
		c := exec.Command(bin, append([]string{"serve", "-q"}, tc.args...)...)
		c.Env = withoutToken()
		if tc.env != "" {
			c.Env = append(c.Env, tc.env)
		}
		out, err := c.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		line := make([]byte, 200)
		n, _ := out.Read(line)
		c.Process.Kill()
		c.Wait()
		if !strings.Contains(string(line[:n]), "serving on") {
			t.Fatalf("serve %v (%s) did not start: %q", tc.args, tc.env, line[:n])
		}
	}
}

// The usage names the real default listen address.
func TestUsageNamesTheLoopbackDefault(t *testing.T) {
	r := runBin(t, 5*time.Second, "help")
	if !strings.Contains(r.stdout, "default 127.0.0.1:20000") || strings.Contains(r.stdout, "default :20000") {
		t.Fatalf("usage:\n%s", r.stdout)
	}
}

// The memory of a run's buffers goes back when the run ends: the heap of a
// server (this process; the client is the binary) is back near where it
// was, without anything else starting a garbage collection.
func TestServerHeapIsBackAfterARun(t *testing.T) {
	srv, err := engine.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv.Logf = func(string, ...any) {}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { srv.Serve(ctx); close(done) }()
	defer func() { cancel(); srv.Close(); <-done }()
	prof := filepath.Join(t.TempDir(), "big.xml")
	xml := `<profile name="big"><group nthreads="2">
  <transaction iterations="1"><flowop type="connect" options="remotehost=$h"/></transaction>
  <transaction iterations="2"><flowop type="write" options="size=64m"/></transaction>
  <transaction iterations="1"><flowop type="disconnect"/></transaction>
</group></profile>`
	if err := os.WriteFile(prof, []byte(xml), 0o644); err != nil {
		t.Fatal(err)
	}
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	base := int64(ms.HeapInuse)
	r := runBin(t, 60*time.Second, "run", prof, "--remote", srv.Addr().String(), "-q", "--json")
	if r.code != exitOK || !strings.Contains(r.stdout, `"bytes": 268435456`) {
		t.Fatalf("the run: exit %d\n%s\n%s", r.code, r.stderr, r.stdout)
	}
	var held int64
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		runtime.ReadMemStats(&ms)
		if held = int64(ms.HeapInuse) - base; held < 16<<20 {
			return
		}
	}
	t.Fatalf("5 s after a run with 128 MiB of buffers the server's heap still holds %d MiB more than before", held>>20)
}

// --max-run-memory and --max-memory: a run over the limit is refused in one
// line (exit 4); limits that make no sense are a usage error.
func TestServeMemoryLimits(t *testing.T) {
	for _, bad := range [][]string{{"--max-run-memory", "1k"}, {"--max-memory", "lots"}, {"--max-run-memory", "1g", "--max-memory", "512m"}} {
		r := runBin(t, 5*time.Second, append([]string{"serve", "--listen", "127.0.0.1:0"}, bad...)...)
		if r.code != exitUsage || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 || !strings.Contains(r.stderr, "--max-") {
			t.Fatalf("serve %v: exit %d, stderr %q", bad, r.code, r.stderr)
		}
	}
	_, addr := server(t, "", "--max-run-memory", "8m")
	r := runBin(t, 20*time.Second, "run", "--workload", "str-writex5m--2", "--iterations", "1", "--remote", addr, "-q")
	if r.code != exitSetup || strings.Count(strings.TrimSpace(r.stderr), "\n") != 0 ||
		!strings.Contains(r.stderr, "more than its limit of 8.0 MiB per run (serve --max-run-memory)") {
		t.Fatalf("a 10 MiB run against --max-run-memory 8m: exit %d, stderr %q", r.code, r.stderr)
	}
	if r := runBin(t, 20*time.Second, "run", "--workload", "str-writex1m--2", "--iterations", "1", "--remote", addr, "-q"); r.code != exitOK {
		t.Fatalf("a 2 MiB run against --max-run-memory 8m: exit %d, stderr %q", r.code, r.stderr)
	}
}
