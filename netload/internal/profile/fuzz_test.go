package profile

import (
	"errors"
	"io/fs"
	"strings"
	"testing"

	"kvmtune/netload/profiles"
)

// FuzzParse feeds arbitrary text to the parser: it must never panic, every
// failure must be a *Error with a message, and every profile it accepts
// must be one the engine can run (strands, sizes and connections resolved).
func FuzzParse(f *testing.F) {
	files, _ := fs.Glob(profiles.FS, "*.xml")
	for _, name := range files {
		b, _ := profiles.FS.ReadFile(name)
		f.Add(b)
	}
	f.Add([]byte(`<profile name="x"><group nthreads="1"><transaction><flowop type="read" options="size=1"/></transaction></group></profile>`))
	f.Add([]byte(`<profile><group nprocs="$nprocs"><transaction duration="5m" rate="3"><flowop type="think" options="duration=1u busy"/></transaction></group></profile>`))
	f.Add([]byte("<?xml version=\"1.0\" encoding=\"latin1\"?><profile/>"))
	f.Fuzz(func(t *testing.T, src []byte) {
		p, err := Parse(src, "fuzz.xml", testVars)
		if err != nil {
			var pe *Error
			if !errors.As(err, &pe) || pe.Msg == "" {
				t.Fatalf("error %T %q is not a *profile.Error with a message", err, err)
			}
			if pe.Pos.Line < 0 || pe.Pos.Col < 0 {
				t.Fatalf("bad position %v", pe.Pos)
			}
			return
		}
		if len(p.Groups) == 0 || p.Strands() < 1 || p.Strands() > MaxStrands {
			t.Fatalf("accepted a profile with %d groups, %d strands", len(p.Groups), p.Strands())
		}
		for _, g := range p.Groups {
			if len(g.Transactions) == 0 {
				t.Fatal("accepted an empty group")
			}
			for _, tx := range g.Transactions {
				if len(tx.Flowops) == 0 || (tx.Iterations < 1) == (tx.Duration <= 0) {
					t.Fatalf("accepted a malformed transaction %+v", tx)
				}
				for _, fo := range tx.Flowops {
					if fo.Conn < 0 || fo.Count < 1 || (fo.Type.Moves() && (fo.Size < 1 || fo.Size > MaxSize)) {
						t.Fatalf("accepted a malformed flowop %+v", fo)
					}
				}
			}
		}
		_ = p.Opposite()
	})
}

func FuzzUnits(f *testing.F) {
	for _, s := range []string{"1", "64k", "1.5m", "30s", "5m", "-1", "1e9", ".", "9999999999999999999g"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseSize(s)
		if err == nil {
			if n < 0 && !strings.Contains(s, "-") {
				t.Fatalf("ParseSize(%q) = %d, negative without a sign", s, n)
			}
			if n >= 0 {
				if back, err := ParseSize(FormatSize(n)); err != nil || back != n {
					t.Fatalf("FormatSize(%d) = %q does not parse back (%d, %v)", n, FormatSize(n), back, err)
				}
			}
		}
		if d, err := ParseTime(s); err == nil && d < 0 && !strings.Contains(s, "-") {
			t.Fatalf("ParseTime(%q) = %v", s, d)
		}
	})
}
