package main

import (
	"bytes"
	"context"
	"image/color"
	"image/png"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestBackoffJitterFlattensThePeak is the fourth exercise: 100 clients
// failing together retry with a peak at least 10x lower with full jitter
// than without.
func TestBackoffJitterFlattensThePeak(t *testing.T) {
	t.Parallel()
	for seed := uint64(1); seed <= 20; seed++ {
		s := backoffSim{Clients: 100, Attempts: 6, Base: time.Second, Cap: time.Minute, Seed: seed}
		if err := s.validate(); err != nil {
			t.Fatal(err)
		}
		res := s.runAll()
		none, full := res[0], res[2]
		if none.Peak != 100 || none.Total != 600 || full.Total != 600 {
			t.Fatalf("seed %d: no-jitter peak %d (want all 100 clients), totals %d and %d", seed, none.Peak, none.Total, full.Total)
		}
		if r := peakRatio(res); r < 10 {
			t.Fatalf("seed %d: peak ratio no jitter / full jitter = %.1f (peaks %d and %d), want at least 10", seed, r, none.Peak, full.Peak)
		}
	}
}

func TestBackoffCommand(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	pngPath := filepath.Join(dir, "storm.png")
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"backoff", "--clients", "100", "--attempts", "6", "--seed", "7", "--png", pngPath}, &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	text := out.String()
	for _, want := range []string{"none jitter: peak 100 retries", "equal jitter", "full jitter", "seed 7", "#", "chart written to"} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q:\n%s", want, text)
		}
	}
	m := regexp.MustCompile(`ratio no jitter / full jitter: ([0-9.]+)x`).FindStringSubmatch(text)
	if m == nil {
		t.Fatalf("no ratio line:\n%s", text)
	}
	if r, _ := strconv.ParseFloat(m[1], 64); r < 10 {
		t.Fatalf("printed ratio %v < 10", r)
	}
	f, err := os.Open(pngPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() != 900 || b.Dy() < 600 {
		t.Fatalf("chart is %v", b)
	}
	// A title and a legend in the strategies' colours, and ink left of and
	// below every panel (tick labels).
	colours := map[color.RGBA]bool{}
	dark := 0
	for y := 0; y < 45; y++ {
		for x := 0; x < 900; x++ {
			c := color.RGBAModel.Convert(img.At(x, y)).(color.RGBA)
			colours[c] = true
			if c.R < 80 && c.G < 80 && c.B < 80 {
				dark++
			}
		}
	}
	for _, c := range strategyColors {
		if !colours[c] {
			t.Errorf("the legend lacks the colour %v", c)
		}
	}
	if dark < 500 {
		t.Errorf("no title or legend text (%d dark pixels)", dark)
	}

	// Each row's bar and PEAK are the same number: the busiest bucket.
	row := regexp.MustCompile(`(?m)^ *\S+ (#*) +(\d+) +(\d+)$`)
	rows := row.FindAllStringSubmatch(text, -1)
	if len(rows) < 3*10 {
		t.Fatalf("%d histogram rows:\n%s", len(rows), text)
	}
	for _, r := range rows {
		peak, _ := strconv.Atoi(r[2])
		inRow, _ := strconv.Atoi(r[3])
		if (peak == 0) != (r[1] == "") || peak > inRow {
			t.Errorf("row %q: bar %q, peak %d, in row %d", r[0], r[1], peak, inRow)
		}
	}
	if strings.Contains(text, "m0") || strings.Contains(text, "1m") {
		t.Errorf("times printed with minutes:\n%s", text)
	}

	// The same seed prints the same report.
	var again bytes.Buffer
	run(context.Background(), []string{"backoff", "--seed", "7"}, &again, &errOut)
	var first bytes.Buffer
	run(context.Background(), []string{"backoff", "--seed", "7"}, &first, &errOut)
	if again.String() != first.String() {
		t.Fatal("same seed, different output")
	}
}

func TestFmtSpan(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		0:                        "0s",
		500 * time.Microsecond:   "500µs",
		10 * time.Millisecond:    "10ms",
		1500 * time.Microsecond:  "1.5ms",
		time.Second:              "1s",
		60490 * time.Millisecond: "60.49s",
		90*time.Second + 1:       "90s",
	} {
		if got := fmtSpan(d); got != want {
			t.Errorf("fmtSpan(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestBackoffUsageErrors(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--clients", "0"},
		{"--clients", "2000000"},
		{"--attempts", "0"},
		{"--attempts", "65"},
		{"--base", "0s"},
		{"--base", "2s", "--cap", "1s"},
		{"--bucket", "-1s"},
		{"--bucket", "1ns", "--attempts", "64"},
		{"--rows", "0"},
		{"--clients", "many"},
	} {
		var out, errOut bytes.Buffer
		if code := run(context.Background(), append([]string{"backoff"}, args...), &out, &errOut); code != exitUsage {
			t.Errorf("%v: exit %d, want %d; stderr %s", args, code, exitUsage, errOut.String())
		}
	}
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"backoff", "--png", filepath.Join(t.TempDir(), "missing", "x.png")}, &out, &errOut); code != exitFailure {
		t.Fatalf("unwritable png: exit %d", code)
	}
}
