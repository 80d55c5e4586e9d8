package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/store/idemmysql"
	"github.com/jackc/pgx/v5"
)

// TestOutboxCommands drives stats, pending, dead, show, redrive, discard
// and purge over a real SQLite outbox.
func TestOutboxCommands(t *testing.T) {
	t.Parallel()
	env, s := sqliteTableStore(t)
	write := sqlWriter(t, s.DB(), s.Outbox())
	seedOutbox(t, s.Outbox(), write)
	checkOutboxCommands(t, env, s.Outbox())
}

// TestOutboxCommandsPostgres is the same over PostgreSQL, in its own schema.
func TestOutboxCommandsPostgres(t *testing.T) {
	t.Parallel()
	env, s := postgresTableStore(t)
	write := func(evs ...outbox.Event) {
		if err := pgx.BeginFunc(t.Context(), s.Pool(), func(tx pgx.Tx) error { return s.Outbox().Write(t.Context(), tx, evs...) }); err != nil {
			t.Fatal(err)
		}
	}
	seedOutbox(t, s.Outbox(), write)
	checkOutboxCommands(t, env, s.Outbox())
}

// seedOutbox leaves one sent event (row 1), three dead ones (rows 2-4) and
// one pending (row 5).
func seedOutbox(t *testing.T, d outbox.Driver, write func(evs ...outbox.Event)) {
	t.Helper()
	var evs []outbox.Event
	for _, id := range []string{"ev-a", "ev-b", "ev-c", "ev-d"} {
		evs = append(evs, outbox.Event{Topic: "orders", Key: "k-" + id, ID: id, Payload: []byte(`{"id":"` + id + `"}`),
			Headers: map[string]string{"content-type": "application/json"}})
	}
	write(evs...)
	pub := outbox.PublisherFunc(func(_ context.Context, msgs []outbox.Message) []error {
		errs := make([]error, len(msgs))
		for i, m := range msgs {
			if m.ID != "ev-a" {
				errs[i] = outbox.PermanentError(errors.New("broker\nsaid no"))
			}
		}
		return errs
	})
	r, err := outbox.NewRelay(d, pub, &outbox.Config{Workers: 1, PurgeInterval: -1, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := r.RunOnce(t.Context()); err != nil || n != 4 {
		t.Fatalf("RunOnce = %d, %v", n, err)
	}
	write(outbox.Event{Topic: "orders", ID: "ev-e", Payload: []byte{0xff, 0x00}})
}

func checkOutboxCommands(t *testing.T, env map[string]string, ob outbox.Admin) {
	t.Helper()
	r := runCLI(t, env, "outbox", "stats")
	wantExit(t, r, exitOK)
	for _, want := range []string{"STATE", "pending  1", "sending  0", "sent     1", "dead     3"} {
		if !strings.Contains(r.Stdout, want) {
			t.Fatalf("stats lacks %q:\n%s", want, r.Stdout)
		}
	}
	r = runCLI(t, env, "outbox", "dead")
	wantExit(t, r, exitOK)
	if strings.Count(r.Stdout, "permanent") != 3 || !strings.Contains(r.Stdout, "broker said no") || !strings.Contains(r.Stdout, "ev-b") {
		t.Fatalf("dead:\n%s", r.Stdout)
	}
	r = runCLI(t, env, "outbox", "pending")
	wantExit(t, r, exitOK)
	if !strings.Contains(r.Stdout, "ev-e") || strings.Contains(r.Stdout, "ev-b") {
		t.Fatalf("pending:\n%s", r.Stdout)
	}
	for _, arg := range []string{"2", "ev-b"} {
		r = runCLI(t, env, "outbox", "show", arg)
		wantExit(t, r, exitOK)
		for _, want := range []string{`"ev-b"`, `"orders"`, "dead", "permanent", "broker said no", "content-type", `payload (text):` + "\n" + `{"id":"ev-b"}`} {
			if !strings.Contains(r.Stdout, want) {
				t.Fatalf("show %s lacks %q:\n%s", arg, want, r.Stdout)
			}
		}
	}
	r = runCLI(t, env, "outbox", "show", "ev-e")
	wantExit(t, r, exitOK, "")
	if !strings.Contains(r.Stdout, "payload (binary, hex)") {
		t.Fatalf("show of a binary payload:\n%s", r.Stdout)
	}

	r = runCLI(t, env, "outbox", "stats", "--json")
	wantExit(t, r, exitOK)
	var stats []statJSON[outbox.State]
	if err := json.Unmarshal([]byte(r.Stdout), &stats); err != nil || len(stats) != 4 || stats[3].State != outbox.StateDead || stats[3].Count != 3 {
		t.Fatalf("stats --json = %+v, %v\n%s", stats, err, r.Stdout)
	}
	r = runCLI(t, env, "outbox", "dead", "--json", "--limit", "2")
	wantExit(t, r, exitOK)
	var dead []outboxRowJSON
	if err := json.Unmarshal([]byte(r.Stdout), &dead); err != nil || len(dead) != 2 || dead[0].DeadReason != idem.DeadPermanent ||
		dead[0].EventID != "ev-b" || dead[0].Attempts != 1 || dead[0].Payload != nil || dead[0].FinishedAt == nil {
		t.Fatalf("dead --json = %+v, %v\n%s", dead, err, r.Stdout)
	}
	r = runCLI(t, env, "outbox", "dead", "--after", "3")
	wantExit(t, r, exitOK)
	if !strings.Contains(r.Stdout, "ev-d") || strings.Contains(r.Stdout, "ev-c") {
		t.Fatalf("dead --after 3:\n%s", r.Stdout)
	}
	r = runCLI(t, env, "outbox", "show", "--json", "ev-e")
	wantExit(t, r, exitOK)
	var row outboxRowJSON
	if err := json.Unmarshal([]byte(r.Stdout), &row); err != nil || row.ID != 5 || row.Payload != nil || string(row.PayloadBase64) != "\xff\x00" ||
		row.State != outbox.StatePending {
		t.Fatalf("show --json = %+v, %v\n%s", row, err, r.Stdout)
	}

	// Errors: one line each, the right exit code, nothing changed.
	wantExit(t, runCLI(t, env, "outbox", "redrive", "1"), exitFailure, "1 of the 1 ids given are not dead events")
	if row, _ := ob.Get(t.Context(), 1); row.State != outbox.StateSent {
		t.Fatalf("redrive of a sent event changed it: %+v", row)
	}
	wantExit(t, runCLI(t, env, "outbox", "show", "99"), exitFailure, `outbox event "99" not found`)
	wantExit(t, runCLI(t, env, "outbox", "show", "nope"), exitFailure, `outbox event "nope" not found`)
	wantExit(t, runCLI(t, env, "outbox", "show", strings.Repeat("x", 300)), exitUsage, "invalid outbox event")
	wantExit(t, runCLI(t, env, "outbox", "redrive", "x"), exitUsage, "invalid outbox row id")
	wantExit(t, runCLI(t, env, "outbox", "redrive"), exitUsage, "--all")
	wantExit(t, runCLI(t, env, "outbox", "redrive", "2", "--all"), exitUsage, "--all")
	wantExit(t, runCLI(t, env, "outbox", "dead", "--limit", "0"), exitUsage, "--limit")
	wantExit(t, runCLI(t, env, "outbox", "pending", "--limit", "1001"), exitUsage, "--limit")
	wantExit(t, runCLI(t, env, "outbox", "purge"), exitUsage, "would delete the sent events older than 24h0m0s", "--yes")
	wantExit(t, runCLI(t, env, "outbox", "purge", "--older-than", "-1s", "--yes"), exitUsage, "--older-than")
	wantExit(t, runCLI(t, env, "outbox", "purge", "--batch", "0", "--yes"), exitUsage, "--batch")
	wantExit(t, runCLI(t, env, "outbox", "discard", "--all"), exitUsage, "would delete every dead event in ", "--yes")
	if st, _ := ob.Stats(t.Context()); st[3].Count != 3 || st[2].Count != 1 {
		t.Fatalf("stats after refused commands: %+v", st)
	}

	r = runCLI(t, env, "outbox", "redrive", "2")
	wantExit(t, r, exitOK)
	if !strings.Contains(r.Stdout, "redrove 1") {
		t.Fatalf("redrive: %s", r.Stdout)
	}
	if row, _ := ob.Get(t.Context(), 2); row.State != outbox.StatePending || row.Attempts != 0 {
		t.Fatalf("redriven event %+v", row)
	}
	r = runCLI(t, env, "outbox", "discard", "3", "--yes")
	wantExit(t, r, exitOK)
	if !strings.Contains(r.Stdout, "discarded 1") {
		t.Fatalf("discard: %s", r.Stdout)
	}
	r = runCLI(t, env, "outbox", "redrive", "--all")
	wantExit(t, r, exitOK)
	if !strings.Contains(r.Stdout, "redrove 1") {
		t.Fatalf("redrive --all: %s", r.Stdout)
	}
	r = runCLI(t, env, "outbox", "dead")
	wantExit(t, r, exitOK)
	if r.Stdout != "no dead events\n" {
		t.Fatalf("dead with none: %q", r.Stdout)
	}
	wantExit(t, runCLI(t, env, "outbox", "discard", "2", "--yes"), exitFailure, "1 of the 1 ids given are not dead events")

	r = runCLI(t, env, "outbox", "purge", "--yes")
	wantExit(t, r, exitOK)
	if r.Stdout != "purged 0 sent event(s)\n" {
		t.Fatalf("purge within 24h: %q", r.Stdout)
	}
	time.Sleep(5 * time.Millisecond)
	r = runCLI(t, env, "outbox", "purge", "--older-than", "1ms", "--batch", "1", "--yes")
	wantExit(t, r, exitOK)
	if r.Stdout != "purged 1 sent event(s)\n" {
		t.Fatalf("purge: %q", r.Stdout)
	}
	if _, err := ob.Get(t.Context(), 1); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("purged event still there: %v", err)
	}
}

// TestOutboxCommandsNotMigrated: a database without idem's tables gets
// one line saying how to fix it.
func TestOutboxCommandsNotMigrated(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "bare.db")
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("CREATE TABLE x (a INTEGER)"); err != nil {
		t.Fatal(err)
	}
	db.Close()
	wantExit(t, runCLI(t, map[string]string{"IDEM_STORE": "sqlite://" + path}, "outbox", "stats"), exitFailure, "migrate up")
}

// TestOutboxCommandsMySQL is TestOutboxCommands over MySQL, in its own
// database.
func TestOutboxCommandsMySQL(t *testing.T) {
	t.Parallel()
	dsn := mysqlDatabase(t)
	env := map[string]string{"IDEM_STORE": dsn}
	wantExit(t, runCLI(t, env, "migrate", "up"), exitOK)
	s, ok := openTestStore(t, storeConfig{DSN: dsn}).(*idemmysql.Store)
	if !ok {
		t.Fatal("mysql:// did not open an idemmysql store")
	}
	write := sqlWriter(t, s.DB(), s.Outbox())
	seedOutbox(t, s.Outbox(), write)
	checkOutboxCommands(t, env, s.Outbox())
}

// sqlWriter writes events with w in a committed transaction of db.
func sqlWriter(t *testing.T, db *sql.DB, w outbox.Writer[*sql.Tx]) func(evs ...outbox.Event) {
	return func(evs ...outbox.Event) {
		t.Helper()
		tx, err := db.BeginTx(t.Context(), nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Write(t.Context(), tx, evs...); err != nil {
			t.Fatal(errors.Join(err, tx.Rollback()))
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
}
