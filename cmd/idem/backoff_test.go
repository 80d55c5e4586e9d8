package main

import (
	"bytes"
	"context"
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
	if b := img.Bounds(); b.Dx() != 800 || b.Dy() < 300 {
		t.Fatalf("chart is %v", b)
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
