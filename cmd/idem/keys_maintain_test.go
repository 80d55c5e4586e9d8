package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestKeysMaintainPostgres: a plain schema is refused until --partition
// converts it; then maintain rotates on demand, and the other commands
// (keys get, purge) work on the partitioned layout.
func TestKeysMaintainPostgres(t *testing.T) {
	t.Parallel()
	url := postgresURL(t)
	schema := testSchema(t, url)
	wantExit(t, runCLI(t, nil, "migrate", "up", "--store", url, "--schema", schema), exitOK)
	wantExit(t, runCLI(t, nil, "keys", "maintain", "--store", url, "--schema", schema), exitUsage, "has the plain table")

	r := runCLI(t, nil, "keys", "maintain", "--store", url, "--schema", schema, "--partition", "--interval", "1h")
	wantExit(t, r, exitOK)
	for _, want := range []string{"converted", "current partition idem_records_p1 (not rotated)", "dropped 1: idem_records_p0"} {
		if !strings.Contains(r.Stdout, want) {
			t.Fatalf("stdout lacks %q:\n%s", want, r.Stdout)
		}
	}
	r = runCLI(t, nil, "keys", "maintain", "--store", url, "--schema", schema, "--rotate")
	wantExit(t, r, exitOK)
	if !strings.Contains(r.Stdout, "current partition idem_records_p2 (rotated)") || !strings.Contains(r.Stdout, "dropped 1: idem_records_p1") {
		t.Fatalf("rotate:\n%s", r.Stdout)
	}
	// The CLI's other commands open the store in the layout they find.
	wantExit(t, runCLI(t, nil, "keys", "get", "--store", url, "--schema", schema, "absent"), exitFailure, "not found")
	wantExit(t, runCLI(t, nil, "keys", "purge", "--store", url, "--schema", schema), exitOK)
	// --partition on a partitioned schema only maintains it.
	r = runCLI(t, nil, "keys", "maintain", "--store", url, "--schema", schema, "--partition")
	wantExit(t, r, exitOK)
	if strings.Contains(r.Stdout, "converted") || !strings.Contains(r.Stdout, "current partition idem_records_p2 (not rotated)") {
		t.Fatalf("second --partition:\n%s", r.Stdout)
	}
}

func TestKeysMaintainErrors(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "idem.db")
	wantExit(t, runCLI(t, nil, "migrate", "up", "--store", "sqlite://"+db), exitOK)
	wantExit(t, runCLI(t, nil, "keys", "maintain", "--store", "sqlite://"+db), exitUsage, "have no partitions")
	wantExit(t, runCLI(t, nil, "keys", "maintain", "--store", "sqlite://"+db, "--interval", "10ms"), exitUsage, "--interval must be at least 1s")
	wantExit(t, runCLI(t, nil, "keys", "maintain", "--store", "sqlite://"+db, "--lock-timeout", "-1s"), exitUsage, "--lock-timeout must not be negative")
}
