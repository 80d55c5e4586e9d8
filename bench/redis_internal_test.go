package bench

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeRedisBenchmark puts a redis-benchmark that runs script first on PATH.
func fakeRedisBenchmark(t *testing.T, script string) {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "redis-benchmark"), []byte("#!/bin/sh\n"+script+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir)
}

// TestRedisBenchmarkErrors: the ceiling row fails with a clear error when
// redis-benchmark is missing, fails, or prints what it does not expect; it
// never reports a rate it did not read.
func TestRedisBenchmarkErrors(t *testing.T) {
	ctx := context.Background()
	s := &Scenario{Concurrency: RedisCallers}
	rate := func(t *testing.T) (float64, error) {
		t.Helper()
		env := &Env{RedisURL: "redis://127.0.0.1:1/0", Prefix: "t"}
		defer env.Close()
		run, err := prepRedisBenchmark(ctx, env, s)
		if err != nil {
			return 0, err
		}
		return run.Rate(ctx, NewStream("t", 10, 0, 1))
	}

	t.Run("Missing", func(t *testing.T) {
		t.Setenv("PATH", t.TempDir())
		if _, err := rate(t); err == nil || !strings.Contains(err.Error(), "redis-tools") {
			t.Fatalf("err = %v, want redis-benchmark not found, with its package", err)
		}
	})
	for name, script := range map[string]string{
		"Fails":   "exit 1",
		"Garbage": "echo nonsense",
		"NoRate":  `echo '"test","rps"'; echo '"SET","0"'`,
	} {
		t.Run(name, func(t *testing.T) {
			fakeRedisBenchmark(t, script)
			if r, err := rate(t); err == nil || !strings.Contains(err.Error(), "redis-benchmark") {
				t.Fatalf("rate %v, err %v; want an error naming redis-benchmark", r, err)
			}
		})
	}
	t.Run("Reads", func(t *testing.T) {
		fakeRedisBenchmark(t, `echo '"test","rps","avg_latency_ms"'; echo '"SET idembench:x 1","123456.50","0.1"'`)
		if r, err := rate(t); err != nil || r != 123456.5 {
			t.Fatalf("rate %v, err %v; want 123456.5", r, err)
		}
	})
}
