package sysstat

import (
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestParseCPULine(t *testing.T) {
	// user nice system idle iowait irq softirq steal guest guest_nice
	busy, total, err := ParseCPULine("cpu  100 5 50 800 20 3 7 15 40 2")
	if err != nil {
		t.Fatal(err)
	}
	// guest and guest_nice are inside user and nice already: not added again
	if total != 100+5+50+800+20+3+7+15 || busy != 100+5+50+3+7+15 {
		t.Fatalf("busy %d total %d", busy, total)
	}
	if _, _, err := ParseCPULine("cpu0 1 2 3 4"); err == nil {
		t.Error("a per-CPU line was accepted as the total")
	}
	if _, _, err := ParseCPULine("cpu 1 2 x 4 5"); err == nil {
		t.Error("a bad field was accepted")
	}
	// older kernels print only four fields after "cpu"
	if b, tot, err := ParseCPULine("cpu 1 2 3 4"); err != nil || b != 6 || tot != 10 {
		t.Errorf("four fields: %d %d %v", b, tot, err)
	}
}

func TestReadProcStatFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "stat")
	os.WriteFile(p, []byte("intr 5\ncpu  10 0 10 80 0 0 0 0 0 0\ncpu0 10 0 10 80 0 0 0 0 0 0\n"), 0o644)
	b, tot, err := ReadProcStat(p)
	if err != nil || b != 20 || tot != 100 {
		t.Fatalf("%d %d %v", b, tot, err)
	}
	os.WriteFile(p, []byte("nothing\n"), 0o644)
	if _, _, err := ReadProcStat(p); err == nil {
		t.Fatal("a file without a cpu line was accepted")
	}
}

func TestDeltaMeasuresOwnCPU(t *testing.T) {
	a := Take()
	// burn about 150 ms of CPU, however long a loaded machine takes to give it
	// (a wall-clock loop got 15 ms of CPU at load average 16)
	giveUp := time.Now().Add(20 * time.Second)
	x := 0.0
	for time.Now().Before(giveUp) && Delta(a, Take()).ProcS < 0.15 {
		for i := 0; i < 100000; i++ {
			x += math.Sqrt(x + 1)
		}
	}
	b := Take()
	d := Delta(a, b)
	if d.ProcS < 0.05 || d.ProcS > d.WallS*float64(d.NCPU)+0.05 {
		t.Fatalf("process CPU %.3fs over %.3fs wall (x=%v)", d.ProcS, d.WallS, x)
	}
	if !d.SystemMeasure || d.SystemBusy <= 0 || d.SystemBusy > 1 {
		t.Fatalf("system busy share %v (measured %v)", d.SystemBusy, d.SystemMeasure)
	}
	sum := d.Add(d)
	if math.Abs(sum.ProcS-2*d.ProcS) > 1e-9 || math.Abs(sum.SystemBusy-d.SystemBusy) > 1e-9 {
		t.Fatalf("Add: %+v", sum)
	}
}

func TestPeakRSS(t *testing.T) {
	if PeakRSS() < 1<<20 {
		t.Fatalf("VmHWM %d bytes: not read", PeakRSS())
	}
}
