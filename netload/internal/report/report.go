// Package report is netload's result document (versioned JSON) and its
// uperf-like text rendering.
package report

import (
	"bytes"
	"encoding/json"
	"time"

	"kvmtune/netload/internal/histogram"
	"kvmtune/netload/internal/sysstat"
	"kvmtune/netload/internal/wire"
)

// SchemaVersion changes whenever a field changes meaning or disappears;
// adding a field does not change it.
const SchemaVersion = 1

// Document is one run.
type Document struct {
	SchemaVersion int            `json:"schema_version"`
	Tool          Tool           `json:"tool"`
	Test          string         `json:"test"`
	Profile       ProfileInfo    `json:"profile"`
	StartedAt     time.Time      `json:"started_at"`
	Remote        string         `json:"remote"`
	Client        *wire.HostInfo `json:"client,omitempty"`
	Server        *wire.HostInfo `json:"server,omitempty"`
	// Servers, in a run of a profile that names several remote hosts, is
	// each host's server and its share of the measured phase. Remote then
	// lists their addresses, comma-separated, Server is the first one's, and
	// every "server" figure elsewhere in the document covers them all.
	Servers   []ServerShare `json:"servers,omitempty"`
	Summary   Summary       `json:"summary"`
	CPU       CPUReport     `json:"cpu"`
	Steps     []Step        `json:"steps"`
	IntervalS float64       `json:"interval_s,omitempty"`
	Intervals []Interval    `json:"intervals,omitempty"`
	// TxnTimeHistogram is the merged transaction-time histogram (ns) of the
	// measured phase, mergeable with other runs' histograms.
	TxnTimeHistogram *histogram.Snapshot `json:"txn_time_histogram_ns,omitempty"`
	PeakRSSBytes     PeakRSS             `json:"peak_rss_bytes"`
	Error            *ErrorInfo          `json:"error"`
}

// ServerShare is one host's server in a multi-host run, over the measured
// phase. Its CPU per MB and per transaction are of the client's bytes and
// transactions, like the document's server CPU.
type ServerShare struct {
	Remotehost   string         `json:"remotehost"` // as the profile names it, variables resolved
	Remote       string         `json:"remote"`     // address of its netload serve
	Host         *wire.HostInfo `json:"host,omitempty"`
	Bytes        int64          `json:"bytes"` // payload this server read and wrote
	Operations   int64          `json:"operations"`
	Errors       int64          `json:"errors"`
	CPU          SideCPU        `json:"cpu"`
	PeakRSSBytes int64          `json:"peak_rss_bytes"`
}

// Tool names the producer.
type Tool struct {
	Name    string `json:"name"`
	Version string `json:"version"`
}

// ProfileInfo says where the profile came from.
type ProfileInfo struct {
	Name   string            `json:"name"`
	Source string            `json:"source"` // file path or "builtin:NAME"
	Users  int               `json:"users"`  // strands in all groups
	XML    string            `json:"xml,omitempty"`
	Vars   map[string]string `json:"vars,omitempty"`
}

// Summary covers the measured phase: every step with a timed (duration)
// transaction, or, when the profile has none, every step that moves data.
type Summary struct {
	MeasuredSteps       []int             `json:"measured_steps"`
	DurationS           float64           `json:"duration_s"`
	BytesRead           int64             `json:"bytes_read"`
	BytesWritten        int64             `json:"bytes_written"`
	Bytes               int64             `json:"bytes"`
	ThroughputBitsPerS  float64           `json:"throughput_bits_per_s"`
	ThroughputBytesPerS float64           `json:"throughput_bytes_per_s"`
	Transactions        int64             `json:"transactions"`
	TransactionsPerS    float64           `json:"transactions_per_s"`
	Operations          int64             `json:"operations"`
	OperationsPerS      float64           `json:"operations_per_s"`
	TxnTimeNs           histogram.Summary `json:"txn_time_ns"`
	Errors              int64             `json:"errors"`
	ServerBytes         int64             `json:"server_bytes"`
	ServerOperations    int64             `json:"server_operations"`
	ServerErrors        int64             `json:"server_errors"`
	// BytesDifferencePct is (server - client) / client bytes of the
	// measured phase, uperf's master/slave "Difference(%)".
	BytesDifferencePct float64 `json:"bytes_difference_pct"`
	// Retransmits counts the TCP segments both sides sent again on the data
	// connections over the whole run (TCP_INFO total_retrans): the loss the
	// path caused, which TCP repaired.
	Retransmits int64 `json:"tcp_retransmits"`
	// CutStrands counts client strands whose operation in progress was cut
	// when the timed transaction ended (a send or receive blocked then).
	CutStrands int64 `json:"cut_strands"`
	// UndeliveredMessages counts messages the client completed that the
	// server had not received when its drain time after the measured phase
	// was up (UndeliveredStrands strands): still in flight, not lost.
	UndeliveredMessages int64 `json:"undelivered_messages"`
	UndeliveredStrands  int64 `json:"undelivered_strands"`
}

// CPUReport is the CPU of each side over the measured phase.
type CPUReport struct {
	Client SideCPU `json:"client"`
	Server SideCPU `json:"server"`
}

// SideCPU is one side's CPU and the seed's "CPU efficiency".
type SideCPU struct {
	sysstat.CPU
	// MB means 10^6 bytes of payload moved (read + written) by the client.
	ProcessCPUSPerMB  float64 `json:"process_cpu_s_per_mb"`
	ProcessCPUUsPerTx float64 `json:"process_cpu_us_per_txn"`
	SystemCPUSPerMB   float64 `json:"system_cpu_s_per_mb"`
	SystemCPUUsPerTx  float64 `json:"system_cpu_us_per_txn"`
}

// Efficiency fills the per-MB and per-transaction figures.
func Efficiency(c sysstat.CPU, bytes, txns int64) SideCPU {
	s := SideCPU{CPU: c}
	if mb := float64(bytes) / 1e6; mb > 0 {
		s.ProcessCPUSPerMB = c.ProcS / mb
		s.SystemCPUSPerMB = c.SystemBusyS / mb
	}
	if txns > 0 {
		s.ProcessCPUUsPerTx = c.ProcS * 1e6 / float64(txns)
		s.SystemCPUUsPerTx = c.SystemBusyS * 1e6 / float64(txns)
	}
	return s
}

// Step is one transaction step (the k-th transaction of every group).
type Step struct {
	Index    int     `json:"index"`
	Timed    bool    `json:"timed"`
	Measured bool    `json:"measured"`
	Txns     []Txn   `json:"transactions"`
	ElapsedS float64 `json:"elapsed_s"`
	CPU      struct {
		Client sysstat.CPU `json:"client"`
		Server sysstat.CPU `json:"server"`
	} `json:"cpu"`
}

// Txn is one group's transaction in a step, as both sides saw it.
type Txn struct {
	Group       int               `json:"group"`
	GroupName   string            `json:"group_name"`
	Description string            `json:"description"`
	Iterations  int64             `json:"iterations,omitempty"`
	DurationS   float64           `json:"duration_s,omitempty"`
	Rate        float64           `json:"rate,omitempty"`
	Strands     int               `json:"strands"`
	ElapsedS    float64           `json:"elapsed_s"`
	TxnTimeNs   histogram.Summary `json:"txn_time_ns"`
	Client      wire.TxnStats     `json:"client"`
	Server      *wire.TxnStats    `json:"server,omitempty"`
}

// Interval is one row of the --interval time series (client side).
type Interval struct {
	TS             float64 `json:"t_s"` // end of the interval, seconds since the run started
	Step           int     `json:"step"`
	DurationS      float64 `json:"duration_s"`
	Bytes          int64   `json:"bytes"`
	ThroughputBps  float64 `json:"throughput_bits_per_s"`
	Transactions   int64   `json:"transactions"`
	TransactionsPS float64 `json:"transactions_per_s"`
	Operations     int64   `json:"operations"`
	OperationsPS   float64 `json:"operations_per_s"`
}

// PeakRSS is each side's peak resident memory (VmHWM).
type PeakRSS struct {
	Client int64 `json:"client"`
	Server int64 `json:"server"`
}

// ErrorInfo explains why a run failed; Class is one of usage, profile,
// connect, setup, peer, run.
type ErrorInfo struct {
	Class   string `json:"class"`
	Message string `json:"message"`
}

// JSON renders the document, indented.
func (d *Document) JSON() ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // keep the profile XML readable
	enc.SetIndent("", "  ")
	if err := enc.Encode(d); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}
