package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemamqp"
	"github.com/idem-go/idem/cmd/idem/internal/console"
	"github.com/spf13/cobra"
)

func init() { commands = append(commands, newConsoleCmd) }

func newConsoleCmd(a *app) *cobra.Command {
	var (
		cfg      *storeConfig
		amqpURL  string
		queues   []string
		listen   string
		token    string
		readOnly bool
	)
	cmd := &cobra.Command{
		Use:   "console",
		Short: "Serve the web console: overview, key search, inbox and dead letters",
		Long: `Serve a web console for on-call engineers: an overview (records by state,
the last hour's executions, inbox backlog, dead letters by reason), a key
search with the stored HTTP response decoded, the inbox's rows with their
attempt history, redrive and discard, and the dead letters of each RabbitMQ
queue given with --queue, with their headers, body and redrive.

Everything is served from the binary. It listens on 127.0.0.1:8090 by
default; it refuses any other than a loopback address unless --token (or
IDEM_CONSOLE_TOKEN) is set, and then every request needs the token, as
"Authorization: Bearer TOKEN" or through the login form (an HttpOnly,
SameSite=Strict cookie). Put it behind a TLS-terminating proxy when it is
reached over a network. --read-only refuses every action. Every action is
logged on stderr with who did it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := console.CheckListen(listen, token); err != nil {
				return usageError{errors.New(trimConsolePrefix(err))}
			}
			var dlqs []console.DeadLetterQueue
			for _, q := range queues {
				dc := &dlqConfig{url: amqpURL, queue: q}
				if err := dc.check(); err != nil {
					return err
				}
				dlqs = append(dlqs, &amqpDLQ{cfg: dc})
			}
			if amqpURL != "" && len(queues) == 0 {
				return usageErrorf("--amqp needs --queue NAME (a consumer's work queue; repeat it for several)")
			}
			return withStore(cmd, cfg, func(s idem.Store) error {
				b, _ := lookupBackend(cfg.DSN)
				logger := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
				srv, err := console.New(console.Config{Store: s, StoreName: describeStore(b, *cfg), Inbox: inboxOf(s),
					DeadLetters: dlqs, Token: token, ReadOnly: readOnly, Logger: logger})
				if err != nil {
					return err
				}
				return serveConsole(cmd.Context(), listen, srv, func(addr net.Addr) {
					mode := ""
					if readOnly {
						mode = " (read-only)"
					}
					fmt.Fprintf(cmd.OutOrStdout(), "idem console: serving %s on http://%s%s\n", describeStore(b, *cfg), addr, mode)
				})
			})
		},
	}
	cfg = addStoreFlags(cmd)
	cmd.Flags().StringVar(&amqpURL, "amqp", "", "RabbitMQ URL whose dead-letter queues to show, amqp://user:pass@host:5672/vhost")
	envFlag(cmd, "amqp", "IDEM_AMQP_URL")
	cmd.Flags().StringArrayVar(&queues, "queue", nil, "a consumer's work queue whose dead letters (QUEUE.dlq) to show; repeat for several")
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:8090", "address to serve on; a non-loopback one needs --token")
	cmd.Flags().StringVar(&token, "token", "", "token every request must present (bearer or login form)")
	envFlag(cmd, "token", "IDEM_CONSOLE_TOKEN")
	cmd.Flags().BoolVar(&readOnly, "read-only", false, "refuse every action (redrive, discard)")
	return cmd
}

func trimConsolePrefix(err error) string {
	msg := err.Error()
	if len(msg) > len("console: ") && msg[:len("console: ")] == "console: " {
		return msg[len("console: "):]
	}
	return msg
}

// serveConsole serves h on addr until ctx ends, then shuts down within a
// few seconds; ready is called with the address once it listens.
func serveConsole(ctx context.Context, addr string, h http.Handler, ready func(net.Addr)) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("console: listen on %s: %w", addr, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 2 * time.Minute, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10}
	ready(ln.Addr())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return fmt.Errorf("console: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("console: shut down: %w", err)
	}
	return nil
}

// amqpDLQ is a RabbitMQ dead-letter queue for the console, read and
// redriven with the code of "idem dlq amqp" (a connection per request).
type amqpDLQ struct {
	cfg *dlqConfig
}

func (q *amqpDLQ) Name() string { return "RabbitMQ " + q.cfg.deadLetterQueue() }

func (q *amqpDLQ) open() (*dlqTarget, error) { return openDLQ(q.cfg, "idem console") }

func (q *amqpDLQ) List(ctx context.Context, limit int) ([]console.DeadLetter, int, error) {
	t, err := q.open()
	if err != nil {
		return nil, 0, err
	}
	defer t.conn.Close()
	var (
		msgs    []console.DeadLetter
		first   = map[string]int{}
		repeats int
	)
	for m, err := range idemamqp.ScanDeadLetters(ctx, t.conn, t.name, limit) {
		if err != nil {
			return nil, 0, err
		}
		if m.Repeat {
			msgs[first[m.DeadLetterID]].Copies++
			repeats++
			continue
		}
		first[m.DeadLetterID] = len(msgs)
		msgs = append(msgs, consoleDeadLetter(m, false))
	}
	return msgs, max(t.ready-repeats, len(msgs)), nil
}

func (q *amqpDLQ) Get(ctx context.Context, id string, limit int) (console.DeadLetter, error) {
	t, err := q.open()
	if err != nil {
		return console.DeadLetter{}, err
	}
	defer t.conn.Close()
	for m, err := range idemamqp.ScanDeadLetters(ctx, t.conn, t.name, limit) {
		if err != nil {
			return console.DeadLetter{}, err
		}
		if m.ID == id && !m.Repeat {
			return consoleDeadLetter(m, true), nil
		}
	}
	return console.DeadLetter{}, fmt.Errorf("dead letter %q: %w", id, idem.ErrNotFound)
}

func (q *amqpDLQ) Redrive(ctx context.Context, ids []string) (console.RedriveResult, error) {
	t, err := q.open()
	if err != nil {
		return console.RedriveResult{}, err
	}
	defer t.conn.Close()
	res, err := idemamqp.Redrive(ctx, t.conn, t.name, func(m idemamqp.DeadMessage) bool { return slices.Contains(ids, m.ID) },
		&idemamqp.RedriveOptions{Limit: 1000})
	out := console.RedriveResult{Redriven: res.Redriven, Capped: res.Capped, Dropped: res.Dropped}
	for _, id := range ids {
		if !slices.Contains(res.Redriven, id) && !slices.Contains(res.Capped, id) {
			out.Missing = append(out.Missing, id)
		}
	}
	return out, err
}

// consoleDeadLetter converts m; full adds its headers (rendered as "dlq
// amqp show" renders them) and body.
func consoleDeadLetter(m idemamqp.DeadMessage, full bool) console.DeadLetter {
	d := console.DeadLetter{ID: m.ID, Reason: string(m.Reason), Attempts: m.Attempts, FirstFailure: m.FirstFailure,
		LastFailure: m.LastFailure, LastError: m.LastError, Consumer: m.Consumer, Origin: m.Origin, Redrives: m.Redrives,
		Published: m.Published, Copies: 1, BodyBytes: len(m.Body)}
	if full {
		for _, k := range slices.Sorted(maps.Keys(m.Headers)) {
			d.Headers = append(d.Headers, console.Header{Name: k, Value: headerValue(m.Headers[k])})
		}
		d.Body = m.Body
	}
	return d
}
