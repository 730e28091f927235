// Package histogram is a log-linear latency histogram (the HDR idea, in
// a simple form): values below 2^(SubBits+1) are counted exactly, above
// that every power-of-two range is cut into 2^SubBits equal buckets.
//
// Error bound: a quantile is reported as the midpoint of the bucket that
// holds the exact nearest-rank value, clamped to the recorded min and max,
// so it differs from the exact value by at most half a bucket width, i.e.
// at most 1/2^(SubBits+1) of the value (0.39 % with SubBits = 7).
//
// Histograms merge exactly (bucket counts add), so per-connection
// histograms can be combined into one per run, and runs into one per
// study, without averaging percentiles.
package histogram

import (
	"fmt"
	"math"
	"math/bits"
)

// SubBits is log2 of the number of buckets per power of two.
const SubBits = 7

const (
	subCount  = 1 << SubBits // buckets per page
	exactMax  = 2 * subCount // values below this are exact
	pageCount = 64 - SubBits // pages: 0 holds [0,256), page p>=1 holds [128<<p, 256<<p)
	// RelativeError is the largest relative error of a reported quantile.
	RelativeError = 1.0 / (2 * subCount)
)

// Histogram counts non-negative integer values (nanoseconds, usually).
// The zero value is ready to use. It is not safe for concurrent use.
type Histogram struct {
	pages [pageCount]*[subCount]uint64 // allocated on first use
	// page 0 needs 256 exact slots: it uses pages[0] for [0,128) and low for [128,256)
	low   *[subCount]uint64
	count uint64
	sum   float64 // float: sums of ns over long runs overflow nothing here
	min   uint64
	max   uint64
}

// index returns page and slot for v.
func index(v uint64) (page, slot int) {
	if v < subCount {
		return 0, int(v)
	}
	if v < exactMax {
		return -1, int(v - subCount) // the "low" page: exact [128,256)
	}
	shift := bits.Len64(v) - (SubBits + 1) // >= 1
	return shift, int(v>>uint(shift)) - subCount
}

// bounds returns the inclusive lower and exclusive upper value of a bucket.
func bounds(page, slot int) (lo, hi uint64) {
	switch {
	case page == 0:
		return uint64(slot), uint64(slot) + 1
	case page == -1:
		return uint64(slot + subCount), uint64(slot+subCount) + 1
	default:
		lo = uint64(slot+subCount) << uint(page)
		return lo, lo + 1<<uint(page)
	}
}

func (h *Histogram) bucket(page int) *[subCount]uint64 {
	if page == -1 {
		if h.low == nil {
			h.low = new([subCount]uint64)
		}
		return h.low
	}
	p := h.pages[page]
	if p == nil {
		p = new([subCount]uint64)
		h.pages[page] = p
	}
	return p
}

// Record adds one value.
func (h *Histogram) Record(v uint64) {
	page, slot := index(v)
	h.bucket(page)[slot]++
	if h.count == 0 || v < h.min {
		h.min = v
	}
	if v > h.max {
		h.max = v
	}
	h.count++
	h.sum += float64(v)
}

// RecordN adds n copies of v.
func (h *Histogram) RecordN(v, n uint64) {
	if n == 0 {
		return
	}
	page, slot := index(v)
	h.bucket(page)[slot] += n
	if h.count == 0 || v < h.min {
		h.min = v
	}
	if v > h.max {
		h.max = v
	}
	h.count += n
	h.sum += float64(v) * float64(n)
}

// Merge adds all of o's counts to h.
func (h *Histogram) Merge(o *Histogram) {
	if o == nil || o.count == 0 {
		return
	}
	if o.low != nil {
		b := h.bucket(-1)
		for i, c := range o.low {
			b[i] += c
		}
	}
	for p, op := range o.pages {
		if op == nil {
			continue
		}
		b := h.bucket(p)
		for i, c := range op {
			b[i] += c
		}
	}
	if h.count == 0 || o.min < h.min {
		h.min = o.min
	}
	if o.max > h.max {
		h.max = o.max
	}
	h.count += o.count
	h.sum += o.sum
}

// Reset empties h, keeping its allocated pages.
func (h *Histogram) Reset() {
	for _, p := range h.pages {
		if p != nil {
			*p = [subCount]uint64{}
		}
	}
	if h.low != nil {
		*h.low = [subCount]uint64{}
	}
	h.count, h.sum, h.min, h.max = 0, 0, 0, 0
}

// Count is the number of recorded values.
func (h *Histogram) Count() uint64 { return h.count }

// Min is the smallest recorded value (0 when empty).
func (h *Histogram) Min() uint64 { return h.min }

// Max is the largest recorded value (0 when empty).
func (h *Histogram) Max() uint64 { return h.max }

// Mean is the exact arithmetic mean (0 when empty).
func (h *Histogram) Mean() float64 {
	if h.count == 0 {
		return 0
	}
	return h.sum / float64(h.count)
}

// Sum is the exact sum of the recorded values (as float64).
func (h *Histogram) Sum() float64 { return h.sum }

// walk calls f for every non-empty bucket in ascending value order.
func (h *Histogram) walk(f func(lo, hi, n uint64) bool) {
	order := func(page int, p *[subCount]uint64) bool {
		if p == nil {
			return true
		}
		for i, c := range p {
			if c == 0 {
				continue
			}
			lo, hi := bounds(page, i)
			if !f(lo, hi, c) {
				return false
			}
		}
		return true
	}
	if !order(0, h.pages[0]) || !order(-1, h.low) {
		return
	}
	for p := 1; p < pageCount; p++ {
		if !order(p, h.pages[p]) {
			return
		}
	}
}

// Quantile returns the value at quantile q (0 < q <= 1) by the
// nearest-rank definition: the smallest recorded value v such that at
// least q*Count values are <= v, within RelativeError. 0 when empty.
func (h *Histogram) Quantile(q float64) uint64 {
	if h.count == 0 {
		return 0
	}
	if q <= 0 {
		return h.min
	}
	if q >= 1 {
		return h.max
	}
	rank := uint64(math.Ceil(q * float64(h.count)))
	if rank < 1 {
		rank = 1
	}
	var seen uint64
	var out uint64
	h.walk(func(lo, hi, n uint64) bool {
		seen += n
		if seen >= rank {
			out = lo + (hi-lo)/2 // midpoint (lo itself for exact buckets)
			return false
		}
		return true
	})
	if out < h.min {
		out = h.min
	}
	if out > h.max {
		out = h.max
	}
	return out
}

// Bucket is one non-empty bucket: values in [Lo, Hi) counted N times.
type Bucket struct {
	Lo uint64 `json:"lo"`
	Hi uint64 `json:"hi"`
	N  uint64 `json:"n"`
}

// Buckets lists the non-empty buckets in ascending order.
func (h *Histogram) Buckets() []Bucket {
	var out []Bucket
	h.walk(func(lo, hi, n uint64) bool {
		out = append(out, Bucket{lo, hi, n})
		return true
	})
	return out
}

// Snapshot is the serialisable form of a histogram.
type Snapshot struct {
	SubBits int      `json:"sub_bucket_bits"`
	Count   uint64   `json:"count"`
	Sum     float64  `json:"sum"`
	Min     uint64   `json:"min"`
	Max     uint64   `json:"max"`
	Buckets []Bucket `json:"buckets"`
}

// Snapshot exports h.
func (h *Histogram) Snapshot() Snapshot {
	return Snapshot{SubBits: SubBits, Count: h.count, Sum: h.sum, Min: h.min, Max: h.max, Buckets: h.Buckets()}
}

// FromSnapshot rebuilds a histogram. It checks that the buckets belong to
// this layout and that counts add up.
func FromSnapshot(s Snapshot) (*Histogram, error) {
	h := &Histogram{}
	if s.Count == 0 {
		return h, nil
	}
	if s.SubBits != SubBits {
		return nil, fmt.Errorf("histogram: sub_bucket_bits %d, want %d", s.SubBits, SubBits)
	}
	var total uint64
	for _, b := range s.Buckets {
		page, slot := index(b.Lo)
		lo, hi := bounds(page, slot)
		if lo != b.Lo || hi != b.Hi {
			return nil, fmt.Errorf("histogram: bucket [%d,%d) is not a bucket of this layout", b.Lo, b.Hi)
		}
		h.bucket(page)[slot] += b.N
		total += b.N
	}
	if total != s.Count {
		return nil, fmt.Errorf("histogram: buckets hold %d values, count says %d", total, s.Count)
	}
	h.count, h.sum, h.min, h.max = s.Count, s.Sum, s.Min, s.Max
	return h, nil
}

// Summary is the usual digest of a histogram, in the histogram's unit.
type Summary struct {
	Count  uint64  `json:"count"`
	Avg    float64 `json:"avg"`
	Min    uint64  `json:"min"`
	Max    uint64  `json:"max"`
	P50    uint64  `json:"p50"`
	P90    uint64  `json:"p90"`
	P99    uint64  `json:"p99"`
	P999   uint64  `json:"p99_9"`
	StdDev float64 `json:"stddev"`
}

// Summarize computes the digest. StdDev is estimated from bucket midpoints.
func (h *Histogram) Summarize() Summary {
	s := Summary{Count: h.count, Avg: h.Mean(), Min: h.min, Max: h.max,
		P50: h.Quantile(0.50), P90: h.Quantile(0.90), P99: h.Quantile(0.99), P999: h.Quantile(0.999)}
	if h.count > 1 {
		mean := s.Avg
		var acc float64
		h.walk(func(lo, hi, n uint64) bool {
			mid := float64(lo) + float64(hi-lo-1)/2
			d := mid - mean
			acc += d * d * float64(n)
			return true
		})
		s.StdDev = math.Sqrt(acc / float64(h.count-1))
	}
	return s
}

// ExactQuantile is the nearest-rank quantile of ascending sorted data, the
// reference that Quantile approximates.
func ExactQuantile(sorted []uint64, q float64) uint64 {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(q * float64(len(sorted))))
	if rank < 1 {
		rank = 1
	}
	if rank > len(sorted) {
		rank = len(sorted)
	}
	return sorted[rank-1]
}
