package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem/idemtest"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemamqp"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/retry"
	"github.com/idem-go/idem/store/idemsqlite"
	amqp "github.com/rabbitmq/amqp091-go"
)

// rabbitURL is IDEM_AMQP_URL: the test skips without it locally and fails
// in CI.
func rabbitURL(t *testing.T) string {
	t.Helper()
	return idemtest.ServiceURL(t, "IDEM_AMQP_URL")
}

func randomSuffix() string {
	b := make([]byte, 6)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// dlqEnv is a uniquely named consumer topology on the real RabbitMQ,
// deleted at cleanup.
type dlqEnv struct {
	url  string
	conn *amqp.Connection
	topo idemamqp.Topology
}

func newDLQEnv(t *testing.T) *dlqEnv {
	t.Helper()
	e := &dlqEnv{url: rabbitURL(t)}
	conn, err := amqp.Dial(e.url)
	if err != nil {
		t.Fatal(err)
	}
	e.conn = conn
	e.topo = idemamqp.Topology{Queue: "idemtest.cli." + randomSuffix()}.WithDefaults()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := idemamqp.Declare(ch, e.topo); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if ch, err := conn.Channel(); err == nil {
			if err := idemamqp.Delete(ch, e.topo); err != nil {
				t.Log(err)
			}
			ch.Close()
		}
		conn.Close()
	})
	return e
}

// run runs "idem dlq amqp ARGS --amqp URL --queue QUEUE" in-process.
func (e *dlqEnv) run(t *testing.T, args ...string) cliResult {
	t.Helper()
	return runCLI(t, nil, append(append([]string{"dlq", "amqp"}, args...), "--amqp", e.url, "--queue", e.topo.Queue)...)
}

// ready is the number of messages ready in queue q.
func (e *dlqEnv) ready(t *testing.T, q string) int {
	t.Helper()
	ch, err := e.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	st, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return st.Messages
}

// waitReady waits until queue q holds n ready messages.
func (e *dlqEnv) waitReady(t *testing.T, q string, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for got := e.ready(t, q); got != n; got = e.ready(t, q) {
		if time.Now().After(deadline) {
			t.Fatalf("%s holds %d messages, want %d", q, got, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (e *dlqEnv) publish(t *testing.T, exchange, key string, p amqp.Publishing) {
	t.Helper()
	ch, err := e.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	if err := idemamqp.Publish(t.Context(), ch, exchange, key, p); err != nil {
		t.Fatal(err)
	}
}

// TestDLQLifecycle is the operator's path end to end: a consumer whose
// handler fails dead-letters three messages; list, show, redrive one after
// the fix (it is processed exactly once), purge the rest.
func TestDLQLifecycle(t *testing.T) {
	t.Parallel()
	e := newDLQEnv(t)
	store, err := idemsqlite.Open(t.Context(), "sqlite://"+filepath.Join(t.TempDir(), "idem.db"), &idemsqlite.Config{AutoMigrate: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()

	var (
		broken    atomic.Bool
		mu        sync.Mutex
		processed = map[string]int{}
	)
	broken.Store(true)
	c, err := idemamqp.NewConsumer(idemamqp.DialURL(e.url), &idemamqp.Config{
		Config: consume.Config{
			Name:   "ledger",
			Retry:  &retry.Policy{Base: 5 * time.Millisecond, Cap: 10 * time.Millisecond, MaxAttempts: 2},
			Logger: slog.New(slog.DiscardHandler),
		},
		Topology: e.topo,
		Process: func(ctx context.Context, msg idem.Message, d consume.Delivery) (idem.Outcome, error) {
			return store.Process(ctx, msg, func(context.Context, *sql.Tx) error {
				if broken.Load() {
					// A terminal escape in the error must not reach the operator's terminal raw.
					return errors.New("ledger locked \x1b[31mred\x1b[0m")
				}
				mu.Lock()
				processed[msg.Key]++
				mu.Unlock()
				return nil
			})
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx) }()
	defer func() { cancel(); <-done }()

	ids := []string{"order-1", "order-2", "order-3"}
	for _, id := range ids {
		e.publish(t, "", e.topo.Queue, amqp.Publishing{MessageId: id, Body: []byte(`{"order":"` + id + `"}`), ContentType: "application/json"})
	}
	e.waitReady(t, e.topo.DeadLetterQueue, 3)

	r := e.run(t, "list")
	wantExit(t, r, exitOK)
	for _, w := range append(ids, "max_attempts", "ledger", "/"+e.topo.Queue, "ledger locked", "3 dead letter(s) in "+e.topo.DeadLetterQueue, "LAST ERROR") {
		if !strings.Contains(r.Stdout, w) {
			t.Errorf("list lacks %q:\n%s", w, r.Stdout)
		}
	}
	if strings.Contains(r.Stdout, "\x1b") {
		t.Errorf("list printed a raw escape character:\n%q", r.Stdout)
	}
	if e.ready(t, e.topo.DeadLetterQueue) != 3 {
		t.Fatal("list consumed dead letters")
	}

	r = e.run(t, "list", "--limit", "1")
	wantExit(t, r, exitOK)
	if !strings.Contains(r.Stdout, "showing 1 of 3") {
		t.Errorf("list --limit 1 does not say it is partial:\n%s", r.Stdout)
	}

	r = e.run(t, "list", "--json")
	wantExit(t, r, exitOK)
	var listed []deadLetterJSON
	if err := json.Unmarshal([]byte(r.Stdout), &listed); err != nil {
		t.Fatalf("list --json: %v\n%s", err, r.Stdout)
	}
	if len(listed) != 3 {
		t.Fatalf("list --json has %d entries, want 3", len(listed))
	}
	for _, l := range listed {
		if l.Reason != string(idem.DeadMaxAttempts) || l.Attempts != 2 || l.Consumer != "ledger" || l.Origin != "/"+e.topo.Queue ||
			l.FirstFailure == nil || l.LastFailure == nil || l.BodyBytes == 0 || !strings.Contains(l.LastError, "ledger locked") || len(l.XDeath) == 0 {
			t.Errorf("list --json entry incomplete: %+v", l)
		}
	}

	r = e.run(t, "list", "--fail-if-any")
	wantExit(t, r, exitDeadLetters, "3 dead letter(s) in "+e.topo.DeadLetterQueue)
	if !strings.Contains(r.Stdout, "order-1") {
		t.Errorf("--fail-if-any did not print the list first:\n%s", r.Stdout)
	}

	r = e.run(t, "show", "order-2")
	wantExit(t, r, exitOK)
	for _, w := range []string{`message "order-2": max_attempts after 2 attempt(s)`, `consumer "ledger"`, "x-death: expired",
		consume.HeaderLastError, consume.HeaderFirstFailure, `{"order":"order-2"}`} {
		if !strings.Contains(r.Stdout, w) {
			t.Errorf("show lacks %q:\n%s", w, r.Stdout)
		}
	}
	wantExit(t, e.run(t, "show", "order-404"), exitFailure, `message "order-404" not found`, "looked at 3")

	wantExit(t, e.run(t, "redrive"), exitUsage, "choose what to redrive")
	wantExit(t, e.run(t, "redrive", "order-1", "--all"), exitUsage, "only one of")
	r = e.run(t, "redrive", "--all", "--dry-run")
	wantExit(t, r, exitOK)
	if !strings.Contains(r.Stdout, "would redrive 3 message(s)") {
		t.Errorf("dry run:\n%s", r.Stdout)
	}
	if e.ready(t, e.topo.DeadLetterQueue) != 3 {
		t.Fatal("dry run moved messages")
	}

	// The handler is fixed: redrive one; it is processed, once.
	broken.Store(false)
	r = e.run(t, "redrive", "order-2")
	wantExit(t, r, exitOK)
	if !strings.Contains(r.Stdout, "redrove 1 message(s)") {
		t.Errorf("redrive:\n%s", r.Stdout)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		n := processed["order-2"]
		mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("order-2 was not processed after the redrive")
		}
		time.Sleep(20 * time.Millisecond)
	}
	e.waitReady(t, e.topo.DeadLetterQueue, 2)
	wantExit(t, e.run(t, "redrive", "order-2"), exitFailure, `not found in `+e.topo.DeadLetterQueue+`: "order-2"`)

	wantExit(t, e.run(t, "purge"), exitUsage, "add --yes")
	if e.ready(t, e.topo.DeadLetterQueue) != 2 {
		t.Fatal("purge without --yes deleted messages")
	}
	r = e.run(t, "purge", "--yes")
	wantExit(t, r, exitOK)
	if !strings.Contains(r.Stdout, "purged 2 message(s)") {
		t.Errorf("purge:\n%s", r.Stdout)
	}
	for _, args := range [][]string{{"list"}, {"list", "--fail-if-any"}} {
		r = e.run(t, args...)
		wantExit(t, r, exitOK)
		if r.Stdout != "no dead letters in "+e.topo.DeadLetterQueue+"\n" {
			t.Errorf("%v on an empty queue: %q", args, r.Stdout)
		}
	}
	r = e.run(t, "list", "--json")
	wantExit(t, r, exitOK)
	if strings.TrimSpace(r.Stdout) != "[]" {
		t.Errorf("list --json on an empty queue: %q", r.Stdout)
	}

	mu.Lock()
	defer mu.Unlock()
	if len(processed) != 1 || processed["order-2"] != 1 {
		t.Errorf("processed %v, want order-2 once and nothing else", processed)
	}
}

// TestDLQDirectDeadLetters covers dead letters published straight into the
// queue with the engine's headers: a binary body, the redrive cap, the
// "dlq amqp" spelling.
func TestDLQDirectDeadLetters(t *testing.T) {
	t.Parallel()
	e := newDLQEnv(t)
	now := time.Now().Add(-time.Hour)
	dead := consume.DeadLetter{
		State:    consume.State{Attempts: 5, FirstFailure: now, LastFailure: now.Add(time.Minute), LastError: strings.Repeat("x", 300)},
		Reason:   idem.DeadPermanent,
		Consumer: "billing",
		Origin:   "payments/charge",
	}
	headers := func(extra map[string]string) amqp.Table {
		h := amqp.Table{}
		for k, v := range dead.Headers() {
			h[k] = v
		}
		for k, v := range extra {
			h[k] = v
		}
		return h
	}
	binary := bytes.Repeat([]byte{0, 1, 2, 0xff}, 1000)
	e.publish(t, e.topo.DeadLetterExchange, e.topo.DeadLetterQueue, amqp.Publishing{MessageId: "bin", Headers: headers(nil), Body: binary})
	e.publish(t, e.topo.DeadLetterExchange, e.topo.DeadLetterQueue, amqp.Publishing{MessageId: "tired",
		Headers: headers(map[string]string{idemamqp.HeaderRedrives: "3"}), Body: []byte("again")})

	r := e.run(t, "list")
	wantExit(t, r, exitOK)
	// The spelling from before the broker word still works, alike.
	if old := runCLI(t, nil, "dlq", "list", "--amqp", e.url, "--queue", e.topo.Queue); old.Code != exitOK || !strings.Contains(old.Stdout, "payments/charge") {
		t.Errorf("idem dlq list (deprecated spelling): exit %d\n%s", old.Code, old.Stdout)
	}
	if !strings.Contains(r.Stdout, "payments/charge") || !strings.Contains(r.Stdout, "permanent") || !strings.Contains(r.Stdout, "…") {
		t.Errorf("list:\n%s", r.Stdout)
	}
	if strings.Contains(r.Stdout, strings.Repeat("x", listErrorWidth)) {
		t.Errorf("last error not truncated:\n%s", r.Stdout)
	}

	r = e.run(t, "show", "bin")
	wantExit(t, r, exitOK)
	if !strings.Contains(r.Stdout, "first 1024 of 4000 bytes") || !strings.Contains(r.Stdout, "00 01 02 ff") || strings.Count(r.Stdout, "\n") > 120 {
		t.Errorf("show preview:\n%s", r.Stdout)
	}
	r = e.run(t, "show", "bin", "--body")
	wantExit(t, r, exitOK)
	if strings.Contains(r.Stdout, "first 1024") || strings.Count(r.Stdout, "00 01 02 ff") < 200 {
		t.Errorf("show --body did not print the whole body (%d lines)", strings.Count(r.Stdout, "\n"))
	}

	// At the cap it stays, and asking for it by id is an error.
	r = e.run(t, "redrive", "tired")
	wantExit(t, r, exitFailure, `kept at the redrive cap: "tired"`)
	r = e.run(t, "redrive", "--reason", string(idem.DeadPermanent), "--max-redrives", "5", "--dry-run")
	wantExit(t, r, exitOK)
	if !strings.Contains(r.Stdout, "would redrive 2 message(s)") {
		t.Errorf("dry run with a higher cap:\n%s", r.Stdout)
	}
	// A reason no dead letter has is a request that did nothing: exit 1.
	r = e.run(t, "redrive", "--reason", "expired")
	wantExit(t, r, exitFailure, "has reason expired")
	if !strings.Contains(r.Stdout, "redrove 0 message(s)") {
		t.Errorf("redrive of an absent reason:\n%s", r.Stdout)
	}
	if got := e.ready(t, e.topo.DeadLetterQueue); got != 2 {
		t.Fatalf("%d dead letters left, want 2", got)
	}
}

// TestDLQRepeats: a dead letter published twice (dead-lettered again after
// a redelivery: the same dead-letter id) is listed once with its copies,
// and a redrive sends one copy back and drops the other.
func TestDLQRepeats(t *testing.T) {
	t.Parallel()
	e := newDLQEnv(t)
	dl := consume.DeadLetter{State: consume.State{Attempts: 1}, Reason: idem.DeadPermanent, Consumer: "billing",
		Origin: "/" + e.topo.Queue, OriginalID: "order-9", DeadLetterID: idemamqp.DeadLetterID(e.topo.Queue, "order-9", []byte("x"))}
	h := amqp.Table{}
	for k, v := range dl.Headers() {
		h[k] = v
	}
	for range 2 {
		e.publish(t, e.topo.DeadLetterExchange, e.topo.DeadLetterQueue, amqp.Publishing{MessageId: "order-9", Headers: h, Body: []byte("x")})
	}
	e.publish(t, e.topo.DeadLetterExchange, e.topo.DeadLetterQueue, amqp.Publishing{MessageId: "other", Headers: amqp.Table{consume.HeaderReason: "permanent"}, Body: []byte("y")})

	r := e.run(t, "list")
	wantExit(t, r, exitOK)
	if strings.Count(r.Stdout, "order-9") != 1 || !strings.Contains(r.Stdout, "2 dead letter(s) in") || !strings.Contains(r.Stdout, "1 repeat(s) not listed") {
		t.Errorf("list:\n%s", r.Stdout)
	}
	r = e.run(t, "list", "--json")
	wantExit(t, r, exitOK)
	if !strings.Contains(r.Stdout, `"copies": 2`) || !strings.Contains(r.Stdout, `"dead_letter_id": "`+dl.DeadLetterID+`"`) {
		t.Errorf("list --json:\n%s", r.Stdout)
	}
	r = e.run(t, "redrive", "order-9", "--dry-run")
	wantExit(t, r, exitOK)
	if !strings.Contains(r.Stdout, "would redrive 1 message(s)") {
		t.Errorf("dry run:\n%s", r.Stdout)
	}
	r = e.run(t, "redrive", "order-9")
	wantExit(t, r, exitOK)
	if !strings.Contains(r.Stdout, "redrove 1 message(s)") || !strings.Contains(r.Stdout, "dropped order-9: a repeat") {
		t.Errorf("redrive:\n%s", r.Stdout)
	}
	if got := e.ready(t, e.topo.DeadLetterQueue); got != 1 {
		t.Fatalf("%d dead letters left, want the other one", got)
	}
}

func TestDLQMissingQueue(t *testing.T) {
	t.Parallel()
	u := rabbitURL(t)
	q := "idemtest.cli.absent." + randomSuffix()
	wantExit(t, runCLI(t, nil, "dlq", "amqp", "list", "--amqp", u, "--queue", q), exitFailure,
		`dead-letter queue "`+q+`.dlq" does not exist`)
	wantExit(t, runCLI(t, nil, "dlq", "amqp", "list", "--amqp", u, "--queue", q+".dlq"), exitFailure,
		"does not exist", "try --queue "+q)
	wantExit(t, runCLI(t, nil, "dlq", "purge", "--yes", "--amqp", u, "--dlq", q), exitFailure,
		`dead-letter queue "`+q+`" does not exist`)
}

// TestDLQWrongPassword: refused credentials are reported as such, without
// the password, not as a broker that may not be running.
func TestDLQWrongPassword(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(rabbitURL(t))
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(u.User.Username(), "not-the-password-42")
	r := runCLI(t, nil, "dlq", "amqp", "list", "--amqp", u.String(), "--queue", "q")
	wantExit(t, r, exitFailure, "refused the user name or password")
	if strings.Contains(r.Stderr, "not-the-password-42") || strings.Contains(r.Stderr, "is it running") {
		t.Fatalf("stderr: %s", r.Stderr)
	}
}

// TestDLQCommandLine needs no broker: every check happens before dialling,
// and an unreachable broker is one line with a hint.
func TestDLQCommandLine(t *testing.T) {
	t.Parallel()
	const down = "amqp://guest:s3cret@127.0.0.1:1/"
	r := runCLI(t, nil, "dlq", "amqp", "list", "--amqp", down, "--queue", "orders")
	wantExit(t, r, exitFailure, "cannot connect to RabbitMQ", "127.0.0.1:1", "IDEM_AMQP_URL")
	if strings.Contains(r.Stderr, "s3cret") {
		t.Errorf("the password leaked: %s", r.Stderr)
	}
	// The environment is the fallback for both flags.
	r = runCLI(t, map[string]string{"IDEM_AMQP_URL": down, "IDEM_AMQP_QUEUE": "orders"}, "dlq", "amqp", "show", "x")
	wantExit(t, r, exitFailure, "cannot connect to RabbitMQ")

	tests := []struct {
		args  []string
		wants []string
	}{
		{[]string{"dlq"}, []string{"missing subcommand, want one of: amqp"}},
		{[]string{"dlq", "kafka"}, []string{`unknown command "kafka" for "idem dlq", want one of: amqp`}},
		{[]string{"dlq", "amqp"}, []string{"missing subcommand, want one of: list, purge, redrive, show"}},
		{[]string{"dlq", "amqp", "list", "--queue", "q"}, []string{"missing --amqp"}},
		{[]string{"dlq", "amqp", "list", "--amqp", down}, []string{"missing --queue"}},
		{[]string{"dlq", "amqp", "list", "--amqp", "http://x", "--queue", "q"}, []string{"not an amqp://"}},
		{[]string{"dlq", "amqp", "list", "--amqp", down, "--queue", "q", "--limit", "0"}, []string{"--limit"}},
		{[]string{"dlq", "amqp", "show", "--amqp", down, "--queue", "q"}, []string{"accepts 1 arg"}},
		{[]string{"dlq", "amqp", "redrive", "--amqp", down, "--queue", "q"}, []string{"choose what to redrive"}},
		{[]string{"dlq", "amqp", "redrive", "--all", "--reason", "x", "--amqp", down, "--queue", "q"}, []string{"only one of"}},
		{[]string{"dlq", "amqp", "redrive", "--reason", "nonsense", "--amqp", down, "--queue", "q"}, []string{`unknown --reason "nonsense"`, "max_attempts", "mismatch", "expired"}},
		{[]string{"dlq", "amqp", "purge", "--amqp", down, "--queue", "q"}, []string{"q.dlq", "add --yes"}},
		// The deprecated spelling without the broker word checks alike.
		{[]string{"dlq", "list", "--queue", "q"}, []string{"missing --amqp"}},
		{[]string{"dlq", "purge", "--amqp", down, "--queue", "q"}, []string{"q.dlq", "add --yes"}},
	}
	for _, tt := range tests {
		wantExit(t, runCLI(t, nil, tt.args...), exitUsage, tt.wants...)
	}

	for _, args := range [][]string{{"dlq", "amqp", "list", "--help"}, {"dlq", "list", "--help"}} {
		r = runCLI(t, nil, args...)
		wantExit(t, r, exitOK)
		for _, w := range []string{"--fail-if-any", "exits 3", "(env IDEM_AMQP_URL)", "--json", "--limit"} {
			if !strings.Contains(r.Stdout, w) {
				t.Errorf("%s lacks %q", strings.Join(args, " "), w)
			}
		}
	}
	// The old spelling is hidden from the help; the broker word is shown.
	r = runCLI(t, nil, "dlq", "--help")
	wantExit(t, r, exitOK)
	if !strings.Contains(r.Stdout, "amqp") || strings.Contains(r.Stdout, "  list ") || !strings.Contains(r.Stdout, "deprecated") {
		t.Errorf("dlq --help:\n%s", r.Stdout)
	}
}

func TestCell(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"":                 "-",
		"plain":            "plain",
		"a\nb\x1b[2Jc":     "a b [2Jc",
		"abcdefghijklmnop": "abcdefghi…",
	} {
		if got := cell(in, 10); got != want {
			t.Errorf("cell(%q) = %q, want %q", in, got, want)
		}
	}
	if got := headerValue(amqp.Table{"b": int64(2), "a": []any{"x", time.Unix(0, 0)}}); got != "{a=[x, 1970-01-01T00:00:00Z] b=2}" {
		t.Errorf("headerValue = %q", got)
	}
	if _, ok := printableText([]byte("héllo\n")[:2]); !ok {
		t.Error("text cut inside a rune is not text")
	}
	if _, ok := printableText([]byte{0, 1}); ok {
		t.Error("binary is text")
	}
}
