package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/store/idemsqlite"
)

// TestPurgeVacuumSQLite: purge reports what it deleted; --vacuum gives the
// space back to the file system and reports the sizes.
func TestPurgeVacuumSQLite(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "idem.db")
	dsn := "sqlite://" + path
	wantExit(t, runCLI(t, nil, "migrate", "up", "--store", dsn), exitOK)
	s, err := idemsqlite.Open(t.Context(), dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	big := []byte(strings.Repeat("r", 50000))
	for i := range 40 {
		seedRecord(t, s, "s", fmt.Sprintf("k-%d", i), big, time.Millisecond)
	}
	s.Close()
	time.Sleep(10 * time.Millisecond)
	before, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	r := runCLI(t, nil, "keys", "purge", "--vacuum", "--store", dsn)
	wantExit(t, r, exitOK)
	if !strings.Contains(r.Stdout, "purged 40 expired records from "+dsn) || !strings.Contains(r.Stdout, "vacuumed "+path+": ") ||
		!strings.Contains(r.Stdout, " MiB → ") {
		t.Fatalf("purge --vacuum printed:\n%s", r.Stdout)
	}
	after, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if after.Size() >= before.Size()/4 {
		t.Fatalf("the file went from %d to %d bytes", before.Size(), after.Size())
	}
}

func TestPurgeVacuumPostgres(t *testing.T) {
	t.Parallel()
	args, s := migratedPostgres(t)
	schema := args[len(args)-1]
	for i := range 50 {
		seedRecord(t, s, "s", fmt.Sprintf("k-%d", i), []byte("result"), time.Millisecond)
	}
	time.Sleep(10 * time.Millisecond)
	r := runCLI(t, nil, append([]string{"keys", "purge", "--vacuum"}, args...)...)
	wantExit(t, r, exitOK)
	if !strings.Contains(r.Stdout, "purged 50 expired records") || !strings.Contains(r.Stdout, "(schema "+schema+")") ||
		!regexp.MustCompile(`vacuumed \d+ idem tables in schema `+schema+`: [0-9.]+ KiB → [0-9.]+ KiB on disk`).MatchString(r.Stdout) {
		t.Fatalf("purge --vacuum printed:\n%s", r.Stdout)
	}
}
