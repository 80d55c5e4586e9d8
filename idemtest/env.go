package idemtest

import (
	"os"
	"testing"
)

// serviceExamples are the URLs the development machines and CI use, quoted
// in skip messages so that a newcomer can copy them.
var serviceExamples = map[string]string{
	"IDEM_POSTGRES_URL": "postgres://postgres@127.0.0.1:5432/test?sslmode=disable",
	"IDEM_REDIS_URL":    "redis://127.0.0.1:6379/0",
	"IDEM_AMQP_URL":     "amqp://guest:guest@127.0.0.1:5672/",
	"IDEM_NATS_URL":     "nats://127.0.0.1:4222",
	"IDEM_MYSQL_URL":    "mysql://root@127.0.0.1:3306/test",
	"IDEM_SQS_URL":      "http://127.0.0.1:4100", // goaws (.ci/run)
}

// ServiceURL returns the value of the environment variable env, the URL of
// a real server a test needs. Without it the test is skipped with a message
// saying what to export — unless the environment variable CI is set, where
// every backend must be exercised and the test fails instead. It never
// falls back to a default address, so a test cannot silently run against a
// server nobody configured.
func ServiceURL(tb testing.TB, env string) string {
	tb.Helper()
	if v := os.Getenv(env); v != "" {
		return v
	}
	if os.Getenv("CI") != "" {
		tb.Fatalf("%s is not set; CI must run the tests that need it", env)
	}
	if ex, ok := serviceExamples[env]; ok {
		tb.Skipf("%s is not set; skipping (export %s=%s to run it)", env, env, ex)
	}
	tb.Skipf("%s is not set; skipping", env)
	return ""
}
