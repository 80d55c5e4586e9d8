package main

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/inbox/inboxdriver"
	"github.com/idem-go/idem/retry"
	"github.com/idem-go/idem/store/idempgx"
	"github.com/idem-go/idem/store/idemsqlite"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestInboxCommands drives stats, dead, show, redrive and discard over a
// real SQLite inbox with one processed and three dead messages.
func TestInboxCommands(t *testing.T) {
	t.Parallel()
	env, s := sqliteTableStore(t)
	seedInbox(t, s.Inbox())
	checkInboxCommands(t, env, s.Inbox())
}

// TestInboxCommandsPostgres is the same over PostgreSQL, in its own schema.
func TestInboxCommandsPostgres(t *testing.T) {
	t.Parallel()
	env, s := postgresTableStore(t)
	seedInbox(t, s.Inbox())
	checkInboxCommands(t, env, s.Inbox())
}

// sqliteTableStore is a migrated SQLite store in a new file for the inbox
// and outbox commands, and the CLI's environment naming it.
func sqliteTableStore(t *testing.T) (map[string]string, *idemsqlite.Store) {
	dsn := "sqlite://" + filepath.Join(t.TempDir(), "idem.db")
	s, err := idemsqlite.Open(t.Context(), dsn, &idemsqlite.Config{AutoMigrate: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return map[string]string{"IDEM_STORE": dsn}, s
}

// postgresTableStore is the same in a new PostgreSQL schema migrated by the
// CLI.
func postgresTableStore(t *testing.T) (map[string]string, *idempgx.Store) {
	url := postgresURL(t)
	schema := testSchema(t, url)
	env := map[string]string{"IDEM_STORE": url, "IDEM_SCHEMA": schema}
	wantExit(t, runCLI(t, env, "migrate", "up"), exitOK)
	pool, err := pgxpool.New(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := idempgx.New(pool, &idempgx.Config{Schema: schema})
	if err != nil {
		t.Fatal(err)
	}
	return env, s
}

// seedInbox leaves one processed message (row 1) and three dead ones.
func seedInbox[Tx any](t *testing.T, ib inboxdriver.Backend[Tx]) {
	t.Helper()
	for i, typ := range []string{"ok", "bad", "bad", "bad"} {
		m := inbox.Message{Source: "orders", ID: "m-" + string(rune('a'+i)), Type: typ, Payload: []byte("{}")}
		if _, err := ib.Receive(t.Context(), m); err != nil {
			t.Fatal(err)
		}
	}
	w, err := inbox.NewWorker[Tx](ib, &inbox.Config{Workers: 1, PurgeInterval: -1,
		Retry: &retry.Policy{Base: time.Millisecond, Cap: time.Millisecond, MaxAttempts: 2}})
	if err != nil {
		t.Fatal(err)
	}
	_ = w.Handle("ok", func(context.Context, Tx, inbox.Message) error { return nil })
	_ = w.Handle("bad", func(context.Context, Tx, inbox.Message) error { return errors.New("card\ndeclined") })
	for {
		n, err := w.RunOnce(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		st, _ := ib.Stats(t.Context())
		if n == 0 && st[0].Count == 0 && st[1].Count == 0 {
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func checkInboxCommands(t *testing.T, env map[string]string, ib inbox.Admin) {
	t.Helper()

	r := runCLI(t, env, "inbox", "stats")
	wantExit(t, r, exitOK)
	for _, want := range []string{"STATE", "pending    0", "processed  1", "dead       3"} {
		if !strings.Contains(r.Stdout, want) {
			t.Fatalf("stats lacks %q:\n%s", want, r.Stdout)
		}
	}
	r = runCLI(t, env, "inbox", "dead")
	wantExit(t, r, exitOK)
	if strings.Count(r.Stdout, "max_attempts") != 3 || !strings.Contains(r.Stdout, "card declined") {
		t.Fatalf("dead:\n%s", r.Stdout)
	}
	r = runCLI(t, env, "inbox", "show", "2")
	wantExit(t, r, exitOK)
	for _, want := range []string{`"m-b"`, "dead", "attempts (2):", "card declined", "payload (text):\n{}\n"} {
		if !strings.Contains(r.Stdout, want) {
			t.Fatalf("show lacks %q:\n%s", want, r.Stdout)
		}
	}

	// --json on every read command, one schema each.
	r = runCLI(t, env, "inbox", "stats", "--json")
	wantExit(t, r, exitOK)
	var stats []statJSON[inbox.State]
	if err := json.Unmarshal([]byte(r.Stdout), &stats); err != nil || len(stats) != 4 || stats[3].State != inbox.StateDead || stats[3].Count != 3 {
		t.Fatalf("stats --json = %+v, %v\n%s", stats, err, r.Stdout)
	}
	r = runCLI(t, env, "inbox", "dead", "--json")
	wantExit(t, r, exitOK)
	var dead []inboxRowJSON
	if err := json.Unmarshal([]byte(r.Stdout), &dead); err != nil || len(dead) != 3 || dead[0].DeadReason != idem.DeadMaxAttempts ||
		dead[0].MessageID != "m-b" || dead[0].Attempts != 2 || dead[0].Payload != nil || dead[0].PayloadBytes != 2 {
		t.Fatalf("dead --json = %+v, %v\n%s", dead, err, r.Stdout)
	}
	r = runCLI(t, env, "inbox", "show", "--json", "2")
	wantExit(t, r, exitOK)
	var row inboxRowJSON
	if err := json.Unmarshal([]byte(r.Stdout), &row); err != nil || row.ID != 2 || row.Payload == nil || *row.Payload != "{}" ||
		len(row.History) != 2 || !strings.Contains(row.History[0].Error, "card") || row.ReceivedAt == nil {
		t.Fatalf("show --json = %+v, %v\n%s", row, err, r.Stdout)
	}

	// A redrive of a row that is not dead (row 1 was processed) did
	// nothing: it says so and fails.
	r = runCLI(t, env, "inbox", "redrive", "1")
	wantExit(t, r, exitFailure, "1 of the 1 ids given are not dead messages")
	if row, _, _ := ib.Get(t.Context(), 1); row.State != inbox.StateProcessed {
		t.Fatalf("redrive of a processed row changed it: %+v", row)
	}
	wantExit(t, runCLI(t, env, "inbox", "show", "99"), exitFailure, "inbox row 99 not found")
	wantExit(t, runCLI(t, env, "inbox", "show", "x"), exitUsage, "invalid inbox row id")
	wantExit(t, runCLI(t, env, "inbox", "redrive"), exitUsage, "--all")
	wantExit(t, runCLI(t, env, "inbox", "redrive", "2", "--all"), exitUsage, "--all")
	wantExit(t, runCLI(t, env, "inbox", "dead", "--limit", "0"), exitUsage, "--limit")

	r = runCLI(t, env, "inbox", "redrive", "2")
	wantExit(t, r, exitOK)
	if !strings.Contains(r.Stdout, "redrove 1") {
		t.Fatalf("redrive: %s", r.Stdout)
	}
	if row, _, _ := ib.Get(t.Context(), 2); row.State != inbox.StatePending || row.Attempts != 0 {
		t.Fatalf("redriven row %+v", row)
	}
	wantExit(t, runCLI(t, env, "inbox", "discard", "--all"), exitUsage, "would delete every dead message in ", "--yes")
	r = runCLI(t, env, "inbox", "discard", "--all", "--yes")
	wantExit(t, r, exitOK)
	if !strings.Contains(r.Stdout, "discarded 2") {
		t.Fatalf("discard: %s", r.Stdout)
	}
	r = runCLI(t, env, "inbox", "redrive", "--all")
	wantExit(t, r, exitOK)
	if !strings.Contains(r.Stdout, "redrove 0") {
		t.Fatalf("redrive all after discard: %s", r.Stdout)
	}
	r = runCLI(t, env, "inbox", "dead")
	wantExit(t, r, exitOK)
	if r.Stdout != "no dead messages\n" {
		t.Fatalf("dead with none: %q", r.Stdout)
	}
	wantExit(t, runCLI(t, env, "inbox", "discard", "3", "--yes"), exitFailure, "1 of the 1 ids given are not dead messages")
}

func TestPrintBytes(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	printBytes(&b, "payload", "--payload-bytes", []byte("héllo wörld"), 2)
	if got := b.String(); got != "\npayload (text):\nh\n… 12 more bytes (--payload-bytes 0 shows all)\n" {
		t.Errorf("text payload cut inside é: %q", got)
	}
	b.Reset()
	printBytes(&b, "payload", "--payload-bytes", []byte{0xff, 0x00, 'a'}, 0)
	if got := b.String(); !strings.HasPrefix(got, "\npayload (binary, hex):\n00000000  ff 00 61") || strings.Contains(got, "more bytes") {
		t.Errorf("binary payload: %q", got)
	}
	b.Reset()
	printBytes(&b, "payload", "--payload-bytes", nil, 0)
	if b.Len() != 0 {
		t.Errorf("empty payload printed %q", b.String())
	}
}
