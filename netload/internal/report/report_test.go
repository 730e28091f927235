package report

import (
	"encoding/json"
	"math"
	"strings"
	"testing"

	"kvmtune/netload/internal/histogram"
	"kvmtune/netload/internal/sysstat"
	"kvmtune/netload/internal/wire"
)

func TestEfficiency(t *testing.T) {
	c := sysstat.CPU{WallS: 10, ProcS: 2, SystemBusyS: 5, SystemBusy: 0.25, NCPU: 2}
	e := Efficiency(c, 4e6, 1000) // 4 MB, 1000 transactions
	if e.ProcessCPUSPerMB != 0.5 || e.SystemCPUSPerMB != 1.25 || e.ProcessCPUUsPerTx != 2000 || e.SystemCPUUsPerTx != 5000 {
		t.Fatalf("%+v", e)
	}
	if z := Efficiency(c, 0, 0); z.ProcessCPUSPerMB != 0 || z.ProcessCPUUsPerTx != 0 || math.IsNaN(z.SystemCPUSPerMB) {
		t.Fatalf("no data must give zeros, not NaN: %+v", z)
	}
}

func TestUnits(t *testing.T) {
	cases := map[string]string{Bytes(0): "0.00B", Bytes(1536): "1.50KB", Bytes(383.61 * 1024 * 1024): "383.61MB",
		Bits(999): "999.00b/s", Bits(1.53e9): "1.53Gb/s", Time(850): "850.00ns", Time(17870): "17.87us", Time(2.46e6): "2.46ms", Time(5.21e9): "5.21s"}
	for got, want := range cases {
		if got != want {
			t.Errorf("got %q want %q", got, want)
		}
	}
}

func sample() *Document {
	var h histogram.Histogram
	for i := 1; i <= 1000; i++ {
		h.Record(uint64(i) * 1000)
	}
	snap := h.Snapshot()
	d := &Document{SchemaVersion: SchemaVersion, Tool: Tool{"netload", "test"}, Test: "rr1c-200x1000--2",
		Profile: ProfileInfo{Name: "rr1c-200x1000", Source: "builtin:rr1c-200x1000", Users: 2}, Remote: "127.0.0.1:20000"}
	d.Steps = []Step{{Index: 1, Txns: []Txn{{Description: "connect", Client: wire.TxnStats{Passes: 2, Ops: 2, Flowops: []wire.FlowopStats{{Type: "connect", Count: 2, SumNs: 2e5, MinNs: 9e4, MaxNs: 11e4}}}}}},
		{Index: 2, Timed: true, Measured: true, ElapsedS: 3, Txns: []Txn{{Description: "write 200 B, read 1000 B", ElapsedS: 3, TxnTimeNs: h.Summarize(),
			Client: wire.TxnStats{Passes: 1000, Ops: 2000, BytesRead: 1000000, BytesWritten: 200000,
				Flowops: []wire.FlowopStats{{Type: "write", Count: 1000, SumNs: 1e6, MinNs: 500, MaxNs: 5000}, {Type: "read", Count: 1000, SumNs: 4e6, MinNs: 900, MaxNs: 9000}}},
			Server: &wire.TxnStats{Passes: 1000, Ops: 2000, BytesRead: 200000, BytesWritten: 1000000}}}}}
	d.Summary = Summary{MeasuredSteps: []int{2}, DurationS: 3, BytesRead: 1000000, BytesWritten: 200000, Bytes: 1200000,
		ThroughputBitsPerS: 3.2e6, ThroughputBytesPerS: 4e5, Transactions: 1000, TransactionsPerS: 333.3, Operations: 2000,
		OperationsPerS: 666.7, TxnTimeNs: h.Summarize(), ServerBytes: 1200000, ServerOperations: 2000}
	d.TxnTimeHistogram = &snap
	d.CPU.Client = Efficiency(sysstat.CPU{WallS: 3, ProcS: 0.6, UserS: 0.1, SysS: 0.5, NCPU: 2, SystemBusy: 0.5, SystemBusyS: 3}, 1200000, 1000)
	d.CPU.Server = Efficiency(sysstat.CPU{WallS: 3, ProcS: 0.3, NCPU: 2}, 1200000, 1000)
	d.PeakRSSBytes = PeakRSS{Client: 5 << 20, Server: 6 << 20}
	return d
}

func TestText(t *testing.T) {
	d := sample()
	var b strings.Builder
	if err := d.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"rr1c-200x1000--2", "Txn2*", "1.14MB /    3.00(s)", "3.20Mb/s", "333 txn/s",
		"Measured", "500.74us", // p50 of 1..1000 us (bucket midpoint, within 0.39 %)
		"989.18us", // p99
		"write", "1.00us", "read", "4.00us",
		"0.5000", "600.00", // client CPU-s per MB and us per transaction
		"Difference(%)", "0.00%", "client 5.00MB, server 6.00MB",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("text lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "ERROR") {
		t.Error("an error line without an error")
	}
	d.Error = &ErrorInfo{Class: "peer", Message: "lost the server"}
	b.Reset()
	d.WriteText(&b)
	if !strings.Contains(b.String(), "ERROR (peer): lost the server") {
		t.Error("error not printed")
	}
}

// The field names other tools read (kvmtune's bench net among them) stay put.
func TestJSONContract(t *testing.T) {
	b, err := sample().JSON()
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	get := func(path string) any {
		var cur any = m
		for _, k := range strings.Split(path, ".") {
			obj, ok := cur.(map[string]any)
			if !ok {
				return nil
			}
			cur = obj[k]
		}
		return cur
	}
	for _, p := range []string{"schema_version", "test", "summary.duration_s", "summary.bytes", "summary.throughput_bytes_per_s",
		"summary.throughput_bits_per_s", "summary.transactions_per_s", "summary.operations_per_s", "summary.errors", "summary.server_errors",
		"summary.txn_time_ns.p50", "summary.txn_time_ns.p90", "summary.txn_time_ns.p99", "summary.txn_time_ns.p99_9", "summary.txn_time_ns.avg",
		"summary.txn_time_ns.min", "summary.txn_time_ns.max", "summary.txn_time_ns.count",
		"cpu.client.process_cpu_s_per_mb", "cpu.client.process_cpu_us_per_txn", "cpu.client.system_cpu_s_per_mb",
		"cpu.client.system_cpu_us_per_txn", "cpu.client.system_busy_share", "cpu.server.process_user_s", "cpu.server.process_sys_s",
		"steps", "txn_time_histogram_ns.buckets", "peak_rss_bytes.client", "peak_rss_bytes.server"} {
		if get(p) == nil {
			t.Errorf("JSON lacks %s", p)
		}
	}
	if get("schema_version").(float64) != 1 {
		t.Error("schema_version is not 1")
	}
	if _, ok := m["error"]; !ok {
		t.Error("error must be present (null) in every document")
	}
	// the exported histogram merges back
	var snap histogram.Snapshot
	hb, _ := json.Marshal(get("txn_time_histogram_ns"))
	json.Unmarshal(hb, &snap)
	h, err := histogram.FromSnapshot(snap)
	if err != nil || h.Count() != 1000 {
		t.Fatalf("histogram from JSON: %v", err)
	}
}
