package main

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemamqp"
	"github.com/idem-go/idem/cmd/idem/internal/console"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/store/idemsqlite"
	amqp "github.com/rabbitmq/amqp091-go"
)

// TestConsoleRefusals: the command line is checked before anything is
// served: a public address without a token, --amqp without --queue, a bad
// --amqp.
func TestConsoleRefusals(t *testing.T) {
	t.Parallel()
	env := map[string]string{"IDEM_STORE": migratedSQLite(t)}
	wantExit(t, runCLI(t, env, "console", "--listen", "0.0.0.0:0"), exitUsage, "without a token", "--token")
	wantExit(t, runCLI(t, env, "console", "--listen", "nonsense"), exitUsage, "HOST:PORT")
	wantExit(t, runCLI(t, env, "console", "--amqp", "amqp://127.0.0.1:1/"), exitUsage, "--queue")
	wantExit(t, runCLI(t, env, "console", "--amqp", "http://x/", "--queue", "q"), exitUsage, "not an amqp://")
	wantExit(t, runCLI(t, map[string]string{"IDEM_STORE": "sqlite://" + filepath.Join(t.TempDir(), "absent.db")}, "console"), exitFailure)
}

// TestConsoleServes runs "idem console" in-process on a free port with a
// token from IDEM_CONSOLE_TOKEN on a public address: requests need it,
// and the command stops cleanly when its context ends.
func TestConsoleServes(t *testing.T) {
	t.Parallel()
	env := map[string]string{"IDEM_STORE": migratedSQLite(t), "IDEM_CONSOLE_TOKEN": "tok-123"}
	ctx, cancel := context.WithCancel(t.Context())
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	var stderr strings.Builder
	go func() {
		done <- runEnv(ctx, []string{"console", "--listen", "0.0.0.0:0", "--read-only"}, pw, &stderr, func(k string) string { return env[k] })
		pw.Close()
	}()
	line, err := bufio.NewReader(pr).ReadString('\n')
	if err != nil {
		t.Fatalf("no address printed: %v (stderr %s)", err, stderr.String())
	}
	go io.Copy(io.Discard, pr)
	if !strings.Contains(line, "(read-only)") {
		t.Errorf("the banner does not say read-only: %q", line)
	}
	_, addr, _ := strings.Cut(line, " on http://")
	_, port, err := net.SplitHostPort(strings.Fields(addr + " ")[0])
	if err != nil {
		t.Fatalf("banner %q: %v", line, err)
	}
	base := "http://127.0.0.1:" + port
	get := func(token string) int {
		req, _ := http.NewRequest(http.MethodGet, base+"/", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get(""); code != http.StatusUnauthorized {
		t.Errorf("without the token: %d", code)
	}
	if code := get("tok-123"); code != http.StatusOK {
		t.Errorf("with the token: %d", code)
	}
	cancel()
	select {
	case code := <-done:
		if code != exitOK {
			t.Fatalf("exit %d: %s", code, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the console did not stop")
	}
}

// TestConsoleRabbitMQ: the console's RabbitMQ queue against the real
// broker: list (a repeat counted once), one message with its headers and
// body, redrive to the origin, and a missing id reported.
func TestConsoleRabbitMQ(t *testing.T) {
	t.Parallel()
	e := newDLQEnv(t)
	dl := consume.DeadLetter{State: consume.State{Attempts: 3, LastError: "card declined"}, Reason: idem.DeadMaxAttempts, Consumer: "billing",
		Origin: "/" + e.topo.Queue, OriginalID: "order-1", DeadLetterID: idemamqp.DeadLetterID(e.topo.Queue, "order-1", []byte(`{"order":1}`))}
	h := amqp.Table{}
	for k, v := range dl.Headers() {
		h[k] = v
	}
	for range 2 { // the same dead letter twice: a repeat after a redelivery
		e.publish(t, e.topo.DeadLetterExchange, e.topo.DeadLetterQueue, amqp.Publishing{MessageId: "order-1", Headers: h, Body: []byte(`{"order":1}`)})
	}
	s, err := idemsqlite.Open(t.Context(), "sqlite://"+filepath.Join(t.TempDir(), "idem.db"), &idemsqlite.Config{AutoMigrate: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	srv, err := console.New(console.Config{Store: s, DeadLetters: []console.DeadLetterQueue{&amqpDLQ{cfg: &dlqConfig{url: e.url, queue: e.topo.Queue}}},
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	get := func(path string) (int, string) {
		resp, err := http.Get(ts.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, body := get("/dlq/list?q=0")
	if code != http.StatusOK || strings.Count(body, ">order-1<") != 1 || !strings.Contains(body, "×2") ||
		!strings.Contains(body, "RabbitMQ "+e.topo.DeadLetterQueue) || !strings.Contains(body, "card declined") {
		t.Fatalf("list: %d\n%s", code, body)
	}
	code, body = get("/dlq/message?q=0&id=order-1")
	if code != http.StatusOK || !strings.Contains(body, consume.HeaderReason) || !strings.Contains(body, "{&#34;order&#34;:1}") {
		t.Fatalf("message: %d\n%s", code, body)
	}
	if code, _ := get("/dlq/message?q=0&id=absent"); code != http.StatusNotFound {
		t.Fatalf("absent message: %d", code)
	}
	if code, body := get("/"); code != http.StatusOK || !strings.Contains(body, "max_attempts") {
		t.Fatalf("overview: %d\n%s", code, body)
	}
	if e.ready(t, e.topo.DeadLetterQueue) != 2 {
		t.Fatal("reading consumed dead letters")
	}

	// Redrive through the page's form.
	jarResp, err := http.Get(ts.URL + "/dlq/list?q=0")
	if err != nil {
		t.Fatal(err)
	}
	jarResp.Body.Close()
	var csrf *http.Cookie
	for _, c := range jarResp.Cookies() {
		if c.Name == "idem_console_csrf" {
			csrf = c
		}
	}
	post := func(form url.Values) int {
		form.Set("csrf", csrf.Value)
		req, _ := http.NewRequest(http.MethodPost, ts.URL+"/dlq/redrive", strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.AddCookie(csrf)
		resp, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post(url.Values{"q": {"0"}, "id": {"absent"}}); code != http.StatusConflict {
		t.Fatalf("redrive of an absent id: %d", code)
	}
	if code := post(url.Values{"q": {"0"}, "id": {"order-1"}}); code != http.StatusSeeOther {
		t.Fatalf("redrive: %d", code)
	}
	e.waitReady(t, e.topo.Queue, 1)
	e.waitReady(t, e.topo.DeadLetterQueue, 0)
}
