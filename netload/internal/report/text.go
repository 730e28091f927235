package report

import (
	"fmt"
	"io"
	"strings"

	"kvmtune/netload/internal/histogram"
	"kvmtune/netload/internal/wire"
)

const rule = "-------------------------------------------------------------------------------"

// Bytes formats a byte count in binary units, as uperf does (1.50MB = 1.5 MiB).
func Bytes(v float64) string {
	suffix := []string{"B", "KB", "MB", "GB", "TB", "PB"}
	i := 0
	for v >= 1024 && i < len(suffix)-1 {
		v /= 1024
		i++
	}
	return fmt.Sprintf("%.2f%s", v, suffix[i])
}

// Bits formats a bit rate in decimal units (1 Mb/s = 10^6 bit/s).
func Bits(v float64) string {
	suffix := []string{"b/s", "Kb/s", "Mb/s", "Gb/s", "Tb/s"}
	i := 0
	for v >= 1000 && i < len(suffix)-1 {
		v /= 1000
		i++
	}
	return fmt.Sprintf("%.2f%s", v, suffix[i])
}

// Time formats nanoseconds adaptively (ns, us, ms, s).
func Time(ns float64) string {
	switch {
	case ns < 1e3:
		return fmt.Sprintf("%.2fns", ns)
	case ns < 1e6:
		return fmt.Sprintf("%.2fus", ns/1e3)
	case ns < 1e9:
		return fmt.Sprintf("%.2fms", ns/1e6)
	}
	return fmt.Sprintf("%.2fs", ns/1e9)
}

// IntervalLine is the progress line printed for one --interval row.
func IntervalLine(iv Interval) string {
	return fmt.Sprintf("%8.2fs Txn%-3d %10s %12s %12.0f txn/s %12.0f op/s",
		iv.TS, iv.Step, Bytes(float64(iv.Bytes)), Bits(iv.ThroughputBps), iv.TransactionsPS, iv.OperationsPS)
}

// WriteText renders the document as a uperf-like report.
func (d *Document) WriteText(w io.Writer) error {
	var b strings.Builder
	users := d.Profile.Users
	fmt.Fprintf(&b, "netload %s: %s (profile %s from %s), %d users, server %s\n",
		d.Tool.Version, d.Test, d.Profile.Name, d.Profile.Source, users, d.Remote)

	for _, st := range d.Steps {
		var bytes, ops, passes int64
		for _, t := range st.Txns {
			bytes += t.Client.BytesRead + t.Client.BytesWritten
			ops += t.Client.Ops
			passes += t.Client.Passes
		}
		var bps, tps, ops2 float64
		if st.ElapsedS > 0 {
			bps = 8 * float64(bytes) / st.ElapsedS
			tps = float64(passes) / st.ElapsedS
			ops2 = float64(ops) / st.ElapsedS
		}
		name := fmt.Sprintf("Txn%d", st.Index)
		if st.Measured {
			name += "*"
		}
		desc := ""
		if len(st.Txns) > 0 {
			desc = st.Txns[0].Description
			if len(st.Txns) > 1 {
				desc += fmt.Sprintf(" (+%d groups)", len(st.Txns)-1)
			}
		}
		fmt.Fprintf(&b, "%-8s %10s / %7.2f(s) = %12s %11.0f txn/s %11.0f op/s  [%s]\n",
			name, Bytes(float64(bytes)), st.ElapsedS, Bits(bps), tps, ops2, desc)
	}
	s := d.Summary
	fmt.Fprintln(&b, rule)
	fmt.Fprintf(&b, "Measured %10s / %7.2f(s) = %12s %11.0f txn/s %11.0f op/s  (steps %s)\n",
		Bytes(float64(s.Bytes)), s.DurationS, Bits(s.ThroughputBitsPerS), s.TransactionsPerS, s.OperationsPerS, ints(s.MeasuredSteps))

	fmt.Fprintf(&b, "\nTransaction time (all users merged; percentiles within %.2f%%)\n", 100*histogram.RelativeError)
	fmt.Fprintf(&b, "%-8s %10s %10s %10s %10s %10s %10s %10s %10s\n", "Txn", "Count", "avg", "min", "p50", "p90", "p99", "p99.9", "max")
	fmt.Fprintln(&b, rule)
	for _, st := range d.Steps {
		for _, t := range st.Txns {
			name := fmt.Sprintf("Txn%d", st.Index)
			if len(st.Txns) > 1 {
				name += "/" + t.GroupName
			}
			b.WriteString(histRow(name, t.TxnTimeNs))
		}
	}
	if s.TxnTimeNs.Count > 0 {
		b.WriteString(histRow("Measured", s.TxnTimeNs))
	}

	fmt.Fprintf(&b, "\n%-12s %10s %10s %10s %10s\n", "Flowop", "Count", "avg", "min", "max")
	fmt.Fprintln(&b, rule)
	agg := map[string]*wire.FlowopStats{}
	var order []string
	for _, st := range d.Steps {
		for _, t := range st.Txns {
			for _, f := range t.Client.Flowops {
				a := agg[f.Type]
				if a == nil {
					a = &wire.FlowopStats{Type: f.Type}
					agg[f.Type] = a
					order = append(order, f.Type)
				}
				a.Add(f)
			}
		}
	}
	for _, k := range order {
		f := agg[k]
		avg := 0.0
		if f.Count > 0 {
			avg = f.SumNs / float64(f.Count)
		}
		fmt.Fprintf(&b, "%-12s %10d %10s %10s %10s\n", k, f.Count, Time(avg), Time(float64(f.MinNs)), Time(float64(f.MaxNs)))
	}

	fmt.Fprintf(&b, "\nCPU over the measured phase (MB = 10^6 bytes moved)\n")
	fmt.Fprintf(&b, "%-8s %9s %8s %8s %9s %10s %11s %12s %13s\n", "Side", "proc-cpu", "user", "sys", "sys-busy", "cpu-s/MB", "cpu-us/txn", "sys-cpu-s/MB", "sys-cpu-us/txn")
	fmt.Fprintln(&b, rule)
	for _, row := range []struct {
		name string
		c    SideCPU
	}{{"client", d.CPU.Client}, {"server", d.CPU.Server}} {
		fmt.Fprintf(&b, "%-8s %8.2fs %7.2fs %7.2fs %8.1f%% %10.4f %11.2f %12.4f %13.2f\n", row.name,
			row.c.ProcS, row.c.UserS, row.c.SysS, 100*row.c.SystemBusy, row.c.ProcessCPUSPerMB, row.c.ProcessCPUUsPerTx,
			row.c.SystemCPUSPerMB, row.c.SystemCPUUsPerTx)
	}

	fmt.Fprintf(&b, "\nRun Statistics (measured phase)\n")
	fmt.Fprintf(&b, "%-16s %9s %12s %14s %12s %8s\n", "Side", "Time", "Data", "Throughput", "Operations", "Errors")
	fmt.Fprintln(&b, rule)
	host := func(h *wire.HostInfo, def string) string {
		if h == nil || h.Hostname == "" {
			return def
		}
		return clipName(def+"@"+h.Hostname, 16)
	}
	sbps := 0.0
	if s.DurationS > 0 {
		sbps = 8 * float64(s.ServerBytes) / s.DurationS
	}
	fmt.Fprintf(&b, "%-16s %8.2fs %12s %14s %12d %8d\n", host(d.Client, "client"), s.DurationS, Bytes(float64(s.Bytes)), Bits(s.ThroughputBitsPerS), s.Operations, s.Errors)
	fmt.Fprintf(&b, "%-16s %8.2fs %12s %14s %12d %8d\n", host(d.Server, "server"), s.DurationS, Bytes(float64(s.ServerBytes)), Bits(sbps), s.ServerOperations, s.ServerErrors)
	for _, sv := range d.Servers {
		bps := 0.0
		if s.DurationS > 0 {
			bps = 8 * float64(sv.Bytes) / s.DurationS
		}
		fmt.Fprintf(&b, "%-16s %8.2fs %12s %14s %12d %8d\n", clipName(" "+sv.Remotehost, 16), s.DurationS, Bytes(float64(sv.Bytes)), Bits(bps), sv.Operations, sv.Errors)
	}
	fmt.Fprintln(&b, rule)
	fmt.Fprintf(&b, "%-16s %9s %11.2f%%\n", "Difference(%)", "", s.BytesDifferencePct)
	if s.Retransmits > 0 || s.UndeliveredMessages > 0 {
		fmt.Fprintf(&b, "TCP retransmits %d; messages cut at the end of the measured time (not counted): %d; "+
			"still in flight when the server stopped waiting: %d messages on %d connections\n",
			s.Retransmits, s.CutStrands, s.UndeliveredMessages, s.UndeliveredStrands)
	}
	fmt.Fprintf(&b, "\nPeak memory (VmHWM): client %s, server %s\n", Bytes(float64(d.PeakRSSBytes.Client)), Bytes(float64(d.PeakRSSBytes.Server)))
	if len(d.Servers) > 0 {
		fmt.Fprintf(&b, "\nServers (one per remote host; the server rows above are their sum)\n")
		for _, sv := range d.Servers {
			name := ""
			if sv.Host != nil {
				name = " (" + sv.Host.Hostname + ")"
			}
			fmt.Fprintf(&b, "  %s at %s%s: %s, %d ops, %d errors, cpu %.2fs, peak memory %s\n", sv.Remotehost, sv.Remote, name,
				Bytes(float64(sv.Bytes)), sv.Operations, sv.Errors, sv.CPU.ProcS, Bytes(float64(sv.PeakRSSBytes)))
		}
	}
	if d.Error != nil {
		fmt.Fprintf(&b, "\nERROR (%s): %s\n", d.Error.Class, d.Error.Message)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func histRow(name string, h histogram.Summary) string {
	if h.Count == 0 {
		return fmt.Sprintf("%-8s %10d\n", name, 0)
	}
	return fmt.Sprintf("%-8s %10d %10s %10s %10s %10s %10s %10s %10s\n", name, h.Count, Time(h.Avg), Time(float64(h.Min)),
		Time(float64(h.P50)), Time(float64(h.P90)), Time(float64(h.P99)), Time(float64(h.P999)), Time(float64(h.Max)))
}

func clipName(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

func ints(v []int) string {
	p := make([]string, len(v))
	for i, x := range v {
		p[i] = fmt.Sprint(x)
	}
	return strings.Join(p, ",")
}
