package idemtest

import (
	"fmt"
	"strings"
	"testing"
)

// recordingTB records how ServiceURL ended the test instead of ending it.
type recordingTB struct {
	testing.TB
	fatal, skip string
}

func (r *recordingTB) Helper() {}
func (r *recordingTB) Fatalf(format string, args ...any) {
	r.fatal = fmt.Sprintf(format, args...)
	panic(r)
}
func (r *recordingTB) Skipf(format string, args ...any) {
	r.skip = fmt.Sprintf(format, args...)
	panic(r)
}

func serviceURL(env string) (url string, rec *recordingTB) {
	rec = &recordingTB{}
	defer func() {
		if p := recover(); p != nil && p != rec {
			panic(p)
		}
	}()
	return ServiceURL(rec, env), rec
}

func TestServiceURL(t *testing.T) {
	t.Setenv("IDEM_TEST_SET_URL", "db://here")
	t.Setenv("IDEM_POSTGRES_URL", "")

	t.Setenv("CI", "")
	if url, rec := serviceURL("IDEM_TEST_SET_URL"); url != "db://here" || rec.fatal != "" || rec.skip != "" {
		t.Fatalf("set variable: url %q, fatal %q, skip %q", url, rec.fatal, rec.skip)
	}
	if _, rec := serviceURL("IDEM_POSTGRES_URL"); rec.fatal != "" || !strings.Contains(rec.skip, "export IDEM_POSTGRES_URL=postgres://") {
		t.Fatalf("locally an unset URL must skip with an example: fatal %q, skip %q", rec.fatal, rec.skip)
	}
	if _, rec := serviceURL("IDEM_UNKNOWN_URL"); rec.skip == "" || rec.fatal != "" {
		t.Fatalf("unknown variable: fatal %q, skip %q", rec.fatal, rec.skip)
	}

	t.Setenv("CI", "true")
	if _, rec := serviceURL("IDEM_POSTGRES_URL"); rec.skip != "" || !strings.Contains(rec.fatal, "CI must run") {
		t.Fatalf("under CI an unset URL must fail: fatal %q, skip %q", rec.fatal, rec.skip)
	}
	if url, _ := serviceURL("IDEM_TEST_SET_URL"); url != "db://here" {
		t.Fatalf("under CI a set URL is returned, got %q", url)
	}
}
