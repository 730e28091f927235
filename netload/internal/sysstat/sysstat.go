// Package sysstat samples CPU use: this process's user and system time
// (getrusage) and the whole machine's busy share (/proc/stat).
package sysstat

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// userHZ is the unit of /proc/stat (USER_HZ, 100 on every Linux ABI).
const userHZ = 100

// Sample is one reading.
type Sample struct {
	At       time.Time
	User     time.Duration // process user time
	Sys      time.Duration // process system time
	Busy     uint64        // machine busy ticks (all CPUs)
	Total    uint64        // machine total ticks (all CPUs)
	ProcStat bool          // /proc/stat was readable
}

// Take reads the counters now.
func Take() Sample {
	s := Sample{At: time.Now()}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
		s.User = time.Duration(ru.Utime.Nano())
		s.Sys = time.Duration(ru.Stime.Nano())
	}
	if busy, total, err := ReadProcStat("/proc/stat"); err == nil {
		s.Busy, s.Total, s.ProcStat = busy, total, true
	}
	return s
}

// ReadProcStat returns busy and total ticks from the "cpu" line: busy is
// everything except idle and iowait; guest time is already inside user.
func ReadProcStat(path string) (busy, total uint64, err error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "cpu ") {
			continue
		}
		return ParseCPULine(line)
	}
	return 0, 0, fmt.Errorf("%s: no cpu line", path)
}

// ParseCPULine parses the aggregate "cpu ..." line of /proc/stat.
func ParseCPULine(line string) (busy, total uint64, err error) {
	fields := strings.Fields(line)
	if len(fields) < 5 || fields[0] != "cpu" {
		return 0, 0, fmt.Errorf("not a cpu line: %q", line)
	}
	var v []uint64
	for _, f := range fields[1:] {
		n, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("bad cpu field %q", f)
		}
		v = append(v, n)
	}
	// user nice system idle iowait irq softirq steal guest guest_nice
	for i, n := range v {
		if i >= 8 { // guest and guest_nice are counted in user and nice already
			break
		}
		total += n
		if i != 3 && i != 4 {
			busy += n
		}
	}
	return busy, total, nil
}

// CPU is the CPU used between two samples.
type CPU struct {
	WallS float64 `json:"wall_s"`
	// process (netload on this side)
	UserS float64 `json:"process_user_s"`
	SysS  float64 `json:"process_sys_s"`
	ProcS float64 `json:"process_cpu_s"`
	// whole machine
	NCPU          int     `json:"ncpu"`
	SystemBusy    float64 `json:"system_busy_share"` // 0..1 of all CPUs
	SystemBusyS   float64 `json:"system_busy_cpu_s"` // CPU-seconds busy on all CPUs
	SystemMeasure bool    `json:"system_measured"`
}

// Delta computes the CPU used from a to b.
func Delta(a, b Sample) CPU {
	c := CPU{WallS: b.At.Sub(a.At).Seconds(), NCPU: runtime.NumCPU()}
	c.UserS = (b.User - a.User).Seconds()
	c.SysS = (b.Sys - a.Sys).Seconds()
	c.ProcS = c.UserS + c.SysS
	if a.ProcStat && b.ProcStat && b.Total > a.Total {
		c.SystemMeasure = true
		c.SystemBusy = float64(b.Busy-a.Busy) / float64(b.Total-a.Total)
		c.SystemBusyS = float64(b.Busy-a.Busy) / userHZ
	}
	return c
}

// Add sums two CPU records (for several measured steps).
func (c CPU) Add(o CPU) CPU {
	r := CPU{WallS: c.WallS + o.WallS, UserS: c.UserS + o.UserS, SysS: c.SysS + o.SysS,
		ProcS: c.ProcS + o.ProcS, NCPU: max(c.NCPU, o.NCPU), SystemBusyS: c.SystemBusyS + o.SystemBusyS,
		SystemMeasure: (c.SystemMeasure || c.WallS == 0) && o.SystemMeasure}
	if r.WallS > 0 {
		// the busy share of the whole span, weighting each part by its length
		r.SystemBusy = (c.SystemBusy*c.WallS + o.SystemBusy*o.WallS) / r.WallS
	}
	return r
}

// PeakRSS returns this process's peak resident set size in bytes (VmHWM).
func PeakRSS() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmHWM:") {
			f := strings.Fields(line)
			if len(f) >= 2 {
				n, _ := strconv.ParseInt(f[1], 10, 64)
				return n * 1024
			}
		}
	}
	return 0
}

// Beside combines the CPU of two processes over the same span, such as the
// servers of a multi-host run: process times and busy CPU-seconds add up,
// the wall time is the longer one, and the busy share is that of all their
// machines' CPUs together (servers on one machine count its CPUs twice).
func (c CPU) Beside(o CPU) CPU {
	r := CPU{WallS: max(c.WallS, o.WallS), UserS: c.UserS + o.UserS, SysS: c.SysS + o.SysS,
		ProcS: c.ProcS + o.ProcS, NCPU: c.NCPU + o.NCPU, SystemBusyS: c.SystemBusyS + o.SystemBusyS,
		SystemMeasure: c.SystemMeasure && o.SystemMeasure}
	if r.WallS > 0 && r.NCPU > 0 {
		r.SystemBusy = r.SystemBusyS / (r.WallS * float64(r.NCPU))
	}
	return r
}
