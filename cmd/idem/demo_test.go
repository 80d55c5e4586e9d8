package main

import (
	"path/filepath"
	"strings"
	"testing"
)

var demoRows = []string{"messages", "deliveries", "expected balance", "naive balance", "idem balance", "idem balance, 8 workers", "duplicates skipped",
	"parallel requests", "charges", "identical replays", "409s seen"}

func TestDemo(t *testing.T) {
	t.Parallel()
	r := runCLI(t, nil, "demo", "--seed", "3")
	wantExit(t, r, exitOK)
	for _, row := range demoRows {
		if !strings.Contains(r.Stdout, "\n  "+row+" ") {
			t.Errorf("table lacks row %q:\n%s", row, r.Stdout)
		}
	}
	if !strings.Contains(r.Stdout, "OK: the idem consumer applied each of the 100 payments exactly once") {
		t.Errorf("no verdict line:\n%s", r.Stdout)
	}
	if strings.Count(r.Stdout, "   exact\n") != 3 || !strings.Contains(r.Stdout, "naive balance") || !strings.Contains(r.Stdout, "wrong by $") {
		t.Errorf("balances not as expected:\n%s", r.Stdout)
	}
	for _, want := range []string{
		"\n  parallel requests                     100   ",
		"\n  charges                                 1   exact\n",
		"\n  identical replays                      99   of 99;",
		"\nOK: one charge; the other 99 requests got the original 201 response, byte for byte.\n",
	} {
		if !strings.Contains(r.Stdout, want) {
			t.Errorf("HTTP exercise: output lacks %q:\n%s", want, r.Stdout)
		}
	}
	// The whole output depends on the seed only.
	again := runCLI(t, nil, "demo", "--seed", "3")
	if again.Stdout != r.Stdout {
		t.Errorf("same seed, different output:\n%s\n---\n%s", r.Stdout, again.Stdout)
	}
	other := runCLI(t, map[string]string{"IDEM_DEMO_SEED": "4"}, "demo")
	wantExit(t, other, exitOK)
	if other.Stdout == r.Stdout || !strings.Contains(other.Stdout, "seed 4") {
		t.Errorf("IDEM_DEMO_SEED=4 gave the output of seed 3")
	}
}

// TestDemoStoreReuse runs the demo twice on one --store: each run has its own
// scope and accounts, so the second is exact too, not all duplicates.
func TestDemoStoreReuse(t *testing.T) {
	t.Parallel()
	dsn := "sqlite://" + filepath.Join(t.TempDir(), "ledger.db")
	for range 2 {
		r := runCLI(t, nil, "demo", "--store", dsn, "--messages", "30", "--workers", "4")
		wantExit(t, r, exitOK)
		if !strings.Contains(r.Stdout, "idem balance, 4 workers") {
			t.Fatalf("demo output:\n%s", r.Stdout)
		}
	}
	// Without the concurrent run the table has no concurrent row; without
	// requests there is no HTTP exercise.
	r := runCLI(t, nil, "demo", "--store", dsn, "--messages", "10", "--workers", "0", "--requests", "0")
	wantExit(t, r, exitOK)
	if strings.Contains(r.Stdout, "workers") || strings.Contains(r.Stdout, "parallel requests") {
		t.Fatalf("--workers 0 --requests 0 still shows a concurrent run or the HTTP exercise:\n%s", r.Stdout)
	}
	r = runCLI(t, map[string]string{"IDEM_DEMO_REQUESTS": "7"}, "demo", "--store", dsn, "--messages", "10", "--workers", "0")
	wantExit(t, r, exitOK)
	if !strings.Contains(r.Stdout, "identical replays                       6   of 6;") {
		t.Fatalf("IDEM_DEMO_REQUESTS=7:\n%s", r.Stdout)
	}
}
