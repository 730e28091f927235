package profile

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// ParseSize reads a byte count the way uperf does: a decimal number
// (fractions allowed) optionally followed by one of B K M G T P E, which
// are binary multipliers (64k = 65536), optionally followed by "b"/"B"
// ("64kb" is accepted too). The result must fit in int64.
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, fmt.Errorf("empty size")
	}
	i := 0
	for i < len(t) && (t[i] >= '0' && t[i] <= '9' || t[i] == '.' || (i == 0 && (t[i] == '-' || t[i] == '+'))) {
		i++
	}
	num, suf := t[:i], strings.ToLower(t[i:])
	if num == "" || num == "-" || num == "+" {
		return 0, fmt.Errorf("%q is not a size (want a number with an optional B/K/M/G/T suffix)", s)
	}
	shift := 0
	switch suf {
	case "", "b":
	case "k", "kb":
		shift = 10
	case "m", "mb":
		shift = 20
	case "g", "gb":
		shift = 30
	case "t", "tb":
		shift = 40
	case "p", "pb":
		shift = 50
	case "e", "eb":
		shift = 60
	default:
		return 0, fmt.Errorf("%q: unknown size suffix %q (sizes take B, K, M, G, T, P or E, binary)", s, t[i:])
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a size", s)
	}
	v := f * math.Exp2(float64(shift))
	if v >= math.MaxInt64 || v <= math.MinInt64 || math.IsNaN(v) {
		return 0, fmt.Errorf("%q is too large", s)
	}
	if v != math.Trunc(v) {
		return 0, fmt.Errorf("%q is not a whole number of bytes", s)
	}
	return int64(v), nil
}

// ParseTime reads a duration the way uperf does: a number with no suffix
// is seconds; suffixes are s (seconds), m or ms (MILLIseconds, as in
// uperf: "5m" is 5 ms, not 5 minutes), u or us (microseconds), n or ns.
func ParseTime(s string) (time.Duration, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, fmt.Errorf("empty time")
	}
	i := 0
	for i < len(t) && (t[i] >= '0' && t[i] <= '9' || t[i] == '.' || (i == 0 && (t[i] == '-' || t[i] == '+'))) {
		i++
	}
	num, suf := t[:i], strings.ToLower(t[i:])
	if num == "" || num == "-" || num == "+" {
		return 0, fmt.Errorf("%q is not a time (want a number with an optional s/ms/us/ns suffix)", s)
	}
	var mult float64
	switch suf {
	case "", "s", "sec":
		mult = 1e9
	case "m", "ms":
		mult = 1e6
	case "u", "us":
		mult = 1e3
	case "n", "ns":
		mult = 1
	default:
		return 0, fmt.Errorf("%q: unknown time suffix %q (times take s, ms, us or ns; a bare number is seconds)", s, t[i:])
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a time", s)
	}
	v := f * mult
	if v >= math.MaxInt64 || v <= math.MinInt64 || math.IsNaN(v) {
		return 0, fmt.Errorf("%q is too large", s)
	}
	return time.Duration(v), nil
}

// parseCount reads a plain non-negative-or-negative integer, allowing
// uperf's binary suffixes (nthreads="1k" is legal in uperf too).
func parseCount(s string) (int64, error) {
	v, err := ParseSize(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a whole number", s)
	}
	return v, nil
}

// FormatSize prints n in uperf's binary units (for messages and names).
func FormatSize(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return strconv.FormatInt(n>>30, 10) + "g"
	case n >= 1<<20 && n%(1<<20) == 0:
		return strconv.FormatInt(n>>20, 10) + "m"
	case n >= 1<<10 && n%(1<<10) == 0:
		return strconv.FormatInt(n>>10, 10) + "k"
	}
	return strconv.FormatInt(n, 10)
}
