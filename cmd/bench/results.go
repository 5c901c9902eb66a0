package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// result is one figure of the table: a value, the reference it is compared
// with (measured in the same run), and the target of the ratio or value.
type result struct {
	Scenario  string  `json:"scenario"`
	Figure    string  `json:"figure"`
	Value     float64 `json:"value"`
	Unit      string  `json:"unit"`
	Reference string  `json:"reference,omitempty"` // what the value is compared with
	RefValue  float64 `json:"ref_value,omitempty"` // its value, in the same unit
	Ratio     float64 `json:"ratio,omitempty"`     // Value / RefValue; 0 when there is no reference
	Target    string  `json:"target,omitempty"`    // e.g. "ratio >= 0.9" or "<= 20 ms"
	Note      string  `json:"note,omitempty"`      // how it was measured, when not obvious
}

// ratio returns a/b, or 0 when b is not positive.
func ratio(a, b float64) float64 {
	if b <= 0 || math.IsNaN(a) || math.IsNaN(b) {
		return 0
	}
	return a / b
}

// report collects the results of a run.
type report struct {
	Started  time.Time `json:"started"`
	Host     hostInfo  `json:"host"`
	Tiny     bool      `json:"tiny"`
	LoadTool string    `json:"load_tool,omitempty"`
	Results  []result  `json:"results"`
	Failures []string  `json:"failures,omitempty"`
}

type hostInfo struct {
	CPUs       int    `json:"cpus"`
	MemoryMiB  int    `json:"memory_mib"`
	PostgreSQL string `json:"postgresql"`
	GoVersion  string `json:"go_version"`
}

func (r *report) add(res result) {
	if res.RefValue > 0 && res.Ratio == 0 {
		res.Ratio = ratio(res.Value, res.RefValue)
	}
	r.Results = append(r.Results, res)
}

// formatValue prints a figure with a precision that suits its size.
func formatValue(v float64, unit string) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return "n/a"
	}
	var s string
	switch {
	case v == math.Trunc(v) && math.Abs(v) < 1e15:
		s = groupThousands(strconv.FormatFloat(v, 'f', 0, 64))
	case math.Abs(v) >= 100:
		s = groupThousands(strconv.FormatFloat(v, 'f', 0, 64))
	case math.Abs(v) >= 10:
		s = strconv.FormatFloat(v, 'f', 1, 64)
	default:
		s = strconv.FormatFloat(v, 'f', 2, 64)
	}
	if unit != "" {
		s += " " + unit
	}
	return s
}

// groupThousands puts commas between groups of three digits of an
// integer's decimal form: 1234567 becomes 1,234,567.
func groupThousands(s string) string {
	sign := ""
	if strings.HasPrefix(s, "-") {
		sign, s = "-", s[1:]
	}
	if len(s) <= 3 {
		return sign + s
	}
	var b strings.Builder
	pre := len(s) % 3
	if pre > 0 {
		b.WriteString(s[:pre])
	}
	for i := pre; i < len(s); i += 3 {
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(s[i : i+3])
	}
	return sign + b.String()
}

// formatRatio prints a ratio with two decimals, or "-" without a reference.
func formatRatio(r float64) string {
	if r == 0 || math.IsNaN(r) || math.IsInf(r, 0) {
		return "-"
	}
	return strconv.FormatFloat(r, 'f', 2, 64)
}

// writeTable prints the results as an aligned table, one block per
// scenario, then the notes and failures.
func writeTable(w io.Writer, rep *report) error {
	tw := tabwriter.NewWriter(w, 2, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\tfigure\tvalue\treference\tratio\ttarget")
	var notes []string
	for _, r := range rep.Results {
		ref := "-"
		if r.Reference != "" {
			ref = r.Reference
			if r.RefValue != 0 {
				ref += " = " + formatValue(r.RefValue, r.Unit)
			}
		}
		target := r.Target
		if target == "" {
			target = "-"
		}
		fig := r.Figure
		if r.Note != "" {
			notes = append(notes, r.Note)
			fig += fmt.Sprintf(" [%d]", len(notes))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", r.Scenario, fig, formatValue(r.Value, r.Unit), ref, formatRatio(r.Ratio), target)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for i, n := range notes {
		fmt.Fprintf(w, "[%d] %s\n", i+1, n)
	}
	for _, f := range rep.Failures {
		fmt.Fprintf(w, "FAILED: %s\n", f)
	}
	return nil
}

func writeJSON(path string, rep *report) error {
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// percentile returns the p-th percentile (0 < p <= 100) of sorted values by
// the nearest-rank method: the smallest value with at least p% of the
// values at or below it. It returns 0 for no values.
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	rank = max(1, min(rank, len(sorted)))
	return sorted[rank-1]
}

// summary is p50, p99 and max of a set of durations, in milliseconds.
type summary struct {
	N   int
	P50 float64
	P99 float64
	Max float64
}

func summarize(ms []float64) summary {
	s := slices.Clone(ms)
	slices.Sort(s)
	if len(s) == 0 {
		return summary{}
	}
	return summary{N: len(s), P50: percentile(s, 50), P99: percentile(s, 99), Max: s[len(s)-1]}
}

// sample is one observation at a time, for windowed percentiles.
type sample struct {
	At time.Time
	MS float64
}

// windowP99 groups samples into windows of width w starting at start and
// returns the p99 of each window in order (0 for an empty window).
func windowP99(samples []sample, start time.Time, w time.Duration) []float64 {
	if len(samples) == 0 || w <= 0 {
		return nil
	}
	buckets := map[int][]float64{}
	last := 0
	for _, s := range samples {
		i := int(s.At.Sub(start) / w)
		if i < 0 {
			i = 0
		}
		buckets[i] = append(buckets[i], s.MS)
		last = max(last, i)
	}
	out := make([]float64, last+1)
	for i := range out {
		b := buckets[i]
		slices.Sort(b)
		out[i] = percentile(b, 99)
	}
	return out
}

// slope is the least-squares slope of ys against their index (per step).
func slope(ys []float64) float64 {
	n := float64(len(ys))
	if n < 2 {
		return 0
	}
	var sx, sy, sxy, sxx float64
	for i, y := range ys {
		x := float64(i)
		sx += x
		sy += y
		sxy += x * y
		sxx += x * x
	}
	d := n*sxx - sx*sx
	if d == 0 {
		return 0
	}
	return (n*sxy - sx*sy) / d
}
