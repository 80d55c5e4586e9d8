package bench_test

import (
	"os"
	"testing"
)

// serviceURL returns the environment variable name's value, skipping the
// test without it locally and failing it under CI, where the servers must
// be there.
func serviceURL(tb testing.TB, name string) string {
	tb.Helper()
	v := os.Getenv(name)
	if v == "" {
		if os.Getenv("CI") != "" {
			tb.Fatalf("%s is not set; CI must run the benchmarks against real servers", name)
		}
		tb.Skipf("%s is not set; skipping (e.g. IDEM_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/test?sslmode=disable IDEM_REDIS_URL=redis://127.0.0.1:6379/0)", name)
	}
	return v
}
