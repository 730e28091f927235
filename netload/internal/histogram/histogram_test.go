package histogram

import (
	"encoding/json"
	"math"
	"math/rand"
	"reflect"
	"sort"
	"testing"
)

var quantiles = []float64{0.001, 0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999, 0.9999, 1}

func datasets() map[string][]uint64 {
	r := rand.New(rand.NewSource(42))
	gen := func(n int, f func() float64) []uint64 {
		out := make([]uint64, n)
		for i := range out {
			v := f()
			if v < 0 {
				v = 0
			}
			out[i] = uint64(v)
		}
		return out
	}
	return map[string][]uint64{
		"small exact":   gen(5000, func() float64 { return float64(r.Intn(256)) }),
		"uniform us":    gen(20000, func() float64 { return 1e3 + r.Float64()*1e6 }),
		"lognormal rtt": gen(50000, func() float64 { return math.Exp(10 + 1.5*r.NormFloat64()) }),
		"exponential":   gen(30000, func() float64 { return r.ExpFloat64() * 5e4 }),
		"bimodal": gen(40000, func() float64 {
			if r.Intn(100) < 3 {
				return 2e8 + r.Float64()*1e8
			}
			return 1.5e4 + r.Float64()*2e3
		}),
		"huge":     gen(1000, func() float64 { return float64(r.Uint64() >> uint(r.Intn(64))) }),
		"constant": gen(777, func() float64 { return 123456789 }),
		"single":   {42},
	}
}

func TestQuantilesWithinStatedError(t *testing.T) {
	for name, data := range datasets() {
		t.Run(name, func(t *testing.T) {
			var h Histogram
			for _, v := range data {
				h.Record(v)
			}
			sorted := append([]uint64(nil), data...)
			sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
			if h.Count() != uint64(len(data)) || h.Min() != sorted[0] || h.Max() != sorted[len(sorted)-1] {
				t.Fatalf("count/min/max %d/%d/%d, want %d/%d/%d", h.Count(), h.Min(), h.Max(), len(data), sorted[0], sorted[len(sorted)-1])
			}
			var sum float64
			for _, v := range data {
				sum += float64(v)
			}
			if m := sum / float64(len(data)); math.Abs(h.Mean()-m) > 1e-9*m+1e-9 {
				t.Fatalf("mean %v, want %v", h.Mean(), m)
			}
			for _, q := range quantiles {
				exact := ExactQuantile(sorted, q)
				got := h.Quantile(q)
				diff := math.Abs(float64(got) - float64(exact))
				bound := RelativeError * float64(exact)
				if exact < exactMax {
					bound = 0 // small values are exact
				}
				if diff > bound+0.5 {
					t.Errorf("q%.4f: got %d, exact %d, error %.5f%% > %.3f%%", q, got, exact, 100*diff/float64(exact), 100*RelativeError)
				}
			}
		})
	}
}

func TestMergeEqualsWhole(t *testing.T) {
	data := datasets()["lognormal rtt"]
	var whole Histogram
	for _, v := range data {
		whole.Record(v)
	}
	parts := make([]Histogram, 7)
	for i, v := range data {
		parts[i%7].Record(v)
	}
	var merged Histogram
	for i := range parts {
		merged.Merge(&parts[i])
	}
	merged.Merge(nil)
	merged.Merge(&Histogram{})
	if !reflect.DeepEqual(whole.Buckets(), merged.Buckets()) {
		t.Fatal("merged buckets differ from the histogram of all values")
	}
	if whole.Count() != merged.Count() || whole.Min() != merged.Min() || whole.Max() != merged.Max() {
		t.Fatal("merged count/min/max differ")
	}
	if math.Abs(whole.Sum()-merged.Sum()) > 1e-6*whole.Sum() {
		t.Fatal("merged sum differs")
	}
	for _, q := range quantiles {
		if whole.Quantile(q) != merged.Quantile(q) {
			t.Errorf("q%v: whole %d merged %d", q, whole.Quantile(q), merged.Quantile(q))
		}
	}
}

func TestSnapshotRoundTrip(t *testing.T) {
	var h Histogram
	for _, v := range datasets()["bimodal"] {
		h.Record(v)
	}
	h.RecordN(5, 10)
	b, err := json.Marshal(h.Snapshot())
	if err != nil {
		t.Fatal(err)
	}
	var s Snapshot
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	g, err := FromSnapshot(s)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(h.Summarize(), g.Summarize()) {
		t.Fatalf("summary after round trip differs:\n%+v\n%+v", h.Summarize(), g.Summarize())
	}
	// corrupt snapshots are refused
	bad := s
	bad.Buckets = append([]Bucket(nil), s.Buckets...)
	bad.Buckets[len(bad.Buckets)-1].Lo++
	if _, err := FromSnapshot(bad); err == nil {
		t.Error("a bucket that is not on the layout was accepted")
	}
	bad = s
	bad.Count++
	if _, err := FromSnapshot(bad); err == nil {
		t.Error("a count that does not match the buckets was accepted")
	}
	bad = s
	bad.SubBits = 3
	if _, err := FromSnapshot(bad); err == nil {
		t.Error("another layout was accepted")
	}
}

func TestBucketLayout(t *testing.T) {
	// every value falls in the bucket whose bounds contain it, buckets are
	// contiguous and each is at most RelativeError*2 wide relative to its start
	prevHi := uint64(0)
	var h Histogram
	for v := uint64(0); v < 1<<16; v++ {
		h.Record(v)
	}
	for _, b := range h.Buckets() {
		if b.Lo != prevHi {
			t.Fatalf("gap before bucket [%d,%d)", b.Lo, b.Hi)
		}
		if b.Lo >= exactMax && float64(b.Hi-b.Lo) > 2*RelativeError*float64(b.Lo)+1e-9 {
			t.Fatalf("bucket [%d,%d) too wide", b.Lo, b.Hi)
		}
		if b.N != b.Hi-b.Lo {
			t.Fatalf("bucket [%d,%d) holds %d values", b.Lo, b.Hi, b.N)
		}
		prevHi = b.Hi
	}
	for _, v := range []uint64{math.MaxUint64, 1 << 63, 1<<40 + 12345} {
		p, s := index(v)
		lo, hi := bounds(p, s)
		if v < lo || (hi > lo && v >= hi) {
			t.Errorf("%d not in its bucket [%d,%d)", v, lo, hi)
		}
	}
}

func TestEmptyAndReset(t *testing.T) {
	var h Histogram
	if h.Quantile(0.5) != 0 || h.Mean() != 0 || h.Summarize().Count != 0 {
		t.Fatal("empty histogram is not zero")
	}
	h.Record(1000)
	h.Reset()
	if h.Count() != 0 || len(h.Buckets()) != 0 {
		t.Fatal("reset did not empty the histogram")
	}
	h.Record(7)
	if h.Min() != 7 || h.Max() != 7 || h.Quantile(0.99) != 7 {
		t.Fatal("min/max after reset")
	}
}

func BenchmarkRecord(b *testing.B) {
	var h Histogram
	for i := 0; i < b.N; i++ {
		h.Record(uint64(i&0xffff) * 977)
	}
}
