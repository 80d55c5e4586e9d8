package main

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/broker/idemamqp"
	"github.com/idem-go/idem/broker/idemsqs"
	"github.com/idem-go/idem/consume"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/spf13/cobra"
)

func init() { commands = append(commands, newDLQCmd) }

// exitDeadLetters is the exit status of "dlq list --fail-if-any" when the
// dead-letter queue is not empty: distinct from 1 so that a monitoring
// script can tell "there are dead letters" from "the check itself failed".
const exitDeadLetters = 3

// Output bounds: a dead letter's fields come from whoever published it.
const (
	listErrorWidth   = 80
	listFieldWidth   = 60
	bodyPreviewBytes = 1024
	headerValueBytes = 512
)

func newDLQCmd(*app) *cobra.Command {
	amqpSubs := func() []*cobra.Command {
		return []*cobra.Command{newDLQListCmd(), newDLQShowCmd(), newDLQRedriveCmd(), newDLQPurgeCmd()}
	}
	amqpCmd := groupCmd("amqp", "Inspect, redrive and purge the dead letters of a RabbitMQ (idemamqp) consumer", amqpSubs()...)
	amqpCmd.Long = `Inspect, redrive and purge the dead letters of an idemamqp consumer.

--queue names the consumer's work queue; its dead letters are in QUEUE.dlq (the
topology idemamqp.Declare creates), or in the queue --dlq names. Zero dead
letters is the normal state: "list --fail-if-any" exits 3 when there are some,
for monitoring scripts and cron alerts.`
	c := groupCmd("dlq", "Inspect, redrive and purge a consumer's dead letters, per broker", amqpCmd, newDLQSQSCmd())
	c.Long = `Inspect, redrive and purge a consumer's dead letters. The word after "dlq"
names the broker: "idem dlq amqp list|show|redrive|purge" for RabbitMQ,
"idem dlq sqs list|show|redrive|purge --queue URL" for Amazon SQS.

The spelling without the broker word ("idem dlq list …", RabbitMQ only) still
works and is deprecated.`
	// The spelling from before the broker word: hidden, kept working.
	for _, sub := range amqpSubs() {
		sub.Hidden = true
		c.AddCommand(sub)
	}
	return c
}

// dlqConfig is the connection and queue every dlq subcommand takes.
type dlqConfig struct {
	url, queue, dlq string
}

func addDLQFlags(cmd *cobra.Command) *dlqConfig {
	cfg := &dlqConfig{}
	cmd.Flags().StringVar(&cfg.url, "amqp", "", "RabbitMQ URL, amqp://user:pass@host:5672/vhost")
	envFlag(cmd, "amqp", "IDEM_AMQP_URL")
	cmd.Flags().StringVar(&cfg.queue, "queue", "", "the consumer's work queue; its dead letters are in QUEUE.dlq")
	envFlag(cmd, "queue", "IDEM_AMQP_QUEUE")
	cmd.Flags().StringVar(&cfg.dlq, "dlq", "", "the dead-letter queue, when it is not QUEUE.dlq")
	return cfg
}

// deadLetterQueue is the queue the commands read.
func (cfg *dlqConfig) deadLetterQueue() string {
	if cfg.dlq != "" {
		return cfg.dlq
	}
	return idemamqp.Topology{Queue: cfg.queue}.WithDefaults().DeadLetterQueue
}

// check validates the command line before anything is dialled.
func (cfg *dlqConfig) check() error {
	if cfg.url == "" {
		return usageErrorf("missing --amqp URL (or IDEM_AMQP_URL), e.g. amqp://guest:guest@127.0.0.1:5672/")
	}
	if u, err := url.Parse(cfg.url); err != nil || (u.Scheme != "amqp" && u.Scheme != "amqps") {
		return usageErrorf("--amqp %s is not an amqp:// or amqps:// URL", redactDSN(cfg.url))
	}
	if cfg.queue == "" && cfg.dlq == "" {
		return usageErrorf("missing --queue NAME (the consumer's work queue) or --dlq NAME")
	}
	return nil
}

// dlqTarget is an open connection and the dead-letter queue it found.
type dlqTarget struct {
	conn *amqp.Connection
	name string
	// ready is the broker's count of messages ready in the queue (those
	// another client holds unacknowledged are not in it).
	ready int
}

// withDLQ connects, checks that the dead-letter queue exists, runs fn and
// closes the connection.
func withDLQ(cmd *cobra.Command, cfg *dlqConfig, fn func(t *dlqTarget) error) error {
	if err := cfg.check(); err != nil {
		return err
	}
	t, err := openDLQ(cfg, "idem dlq")
	if err != nil {
		return err
	}
	defer t.conn.Close()
	return fn(t)
}

// openDLQ connects as name and checks that the dead-letter queue exists;
// the caller closes t.conn.
func openDLQ(cfg *dlqConfig, name string) (t *dlqTarget, err error) {
	conn, err := amqp.DialConfig(cfg.url, amqp.Config{
		Dial:       amqp.DefaultDial(10 * time.Second),
		Properties: amqp.Table{"connection_name": name},
	})
	switch {
	case errors.Is(err, amqp.ErrCredentials), errors.Is(err, amqp.ErrSASL):
		return nil, fmt.Errorf("RabbitMQ at %s refused the user name or password in --amqp (or IDEM_AMQP_URL)", redactDSN(cfg.url))
	case errors.Is(err, amqp.ErrVhost):
		return nil, fmt.Errorf("RabbitMQ at %s: the user in --amqp has no access to the virtual host", redactDSN(cfg.url))
	case err != nil:
		return nil, fmt.Errorf("cannot connect to RabbitMQ at %s: %v (is it running? check --amqp or IDEM_AMQP_URL)", redactDSN(cfg.url), err)
	}
	defer func() {
		if err != nil {
			conn.Close()
		}
	}()
	t = &dlqTarget{conn: conn, name: cfg.deadLetterQueue()}
	ch, err := conn.Channel()
	if err != nil {
		return nil, fmt.Errorf("open channel on %s: %w", redactDSN(cfg.url), err)
	}
	q, err := ch.QueueDeclarePassive(t.name, true, false, false, false, nil)
	if err != nil {
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.NotFound {
			hint := "was the consumer's topology declared? --dlq names a dead-letter queue with another name"
			if base, ok := strings.CutSuffix(cfg.queue, ".dlq"); ok && cfg.dlq == "" {
				hint = fmt.Sprintf("--queue names the work queue: try --queue %s", base)
			}
			return nil, fmt.Errorf("dead-letter queue %q does not exist on %s (%s)", t.name, redactDSN(cfg.url), hint)
		}
		return nil, fmt.Errorf("inspect queue %q: %w", t.name, err)
	}
	ch.Close()
	t.ready = q.Messages
	return t, nil
}

func newDLQListCmd() *cobra.Command {
	var (
		limit     int
		asJSON    bool
		failIfAny bool
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "One line per dead letter: id, reason, attempts, failure times, consumer, origin, last error",
		Long: `List the dead letters without consuming them: they stay in the queue.

Zero dead letters is the normal state: the command then prints
"no dead letters in QUEUE.dlq" and exits 0. With --fail-if-any it exits 3 when
the queue is not empty (after printing the list), so that a cron job or a
monitoring check can alert on it:

  idem dlq amqp list --queue orders --fail-if-any || alert "orders has dead letters"

A message dead-lettered again after a redelivery (its ack was lost) carries
the same dead-letter id: it is listed once, and the number of such repeats
follows the list ("copies" in --json). redrive sends one copy back and drops
the others.

Exit status: 0 listed (or empty), 1 the command failed (broker unreachable,
queue missing), 2 the command line was wrong, 3 --fail-if-any and dead letters.`,
		Args: cobra.NoArgs,
	}
	cfg := addDLQFlags(cmd)
	cmd.Flags().IntVar(&limit, "limit", 100, "show at most N dead letters")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array, for scripts")
	cmd.Flags().BoolVar(&failIfAny, "fail-if-any", false, "exit 3 when the dead-letter queue is not empty (for monitoring)")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if limit < 1 {
			return usageErrorf("--limit must be at least 1, got %d", limit)
		}
		return withDLQ(cmd, cfg, func(t *dlqTarget) error {
			var (
				msgs      []idemamqp.DeadMessage
				bodyBytes []int
				first     = map[string]int{} // dead-letter id -> index in msgs
				repeats   int
			)
			for m, err := range idemamqp.ScanDeadLetters(cmd.Context(), t.conn, t.name, limit) {
				if err != nil {
					return err
				}
				if m.Repeat {
					// The same dead letter again, after a redelivery:
					// listed once, with its copies counted.
					msgs[first[m.DeadLetterID]].Copies++
					repeats++
					continue
				}
				first[m.DeadLetterID] = len(msgs)
				m.Copies = 1
				bodyBytes = append(bodyBytes, len(m.Body))
				m.Body = nil // only its length is listed; do not hold it
				msgs = append(msgs, m)
			}
			out := cmd.OutOrStdout()
			total := max(t.ready-repeats, len(msgs))
			if asJSON {
				if err := writeDeadLettersJSON(out, msgs, bodyBytes); err != nil {
					return err
				}
			} else {
				writeDeadLetterList(out, t, msgs, total, time.Now())
			}
			if failIfAny && total > 0 {
				return exitCodeError{exitDeadLetters, fmt.Errorf("%d dead letter(s) in %s", total, t.name)}
			}
			return nil
		})
	}
	return cmd
}

func writeDeadLetterList(w io.Writer, t *dlqTarget, msgs []idemamqp.DeadMessage, total int, now time.Time) {
	rows := make([]listRow, len(msgs))
	for i, m := range msgs {
		rows[i] = listRow{m.ID, m.DeadLetter, m.Age(now)}
	}
	if !writeListRows(w, t.name, rows, total) {
		return
	}
	if repeats := repeatCount(msgs); repeats > 0 {
		fmt.Fprintf(w, "%d repeat(s) not listed: the same dead letter (same dead-letter id) published again after a redelivery\n", repeats)
	}
}

// listRow is one line of "dlq … list".
type listRow struct {
	id  string
	dl  consume.DeadLetter
	age time.Duration
}

// writeListRows prints the dead letters of queue as a table and a line
// with their count (total, when the queue holds more than were read); with
// none it prints so and returns false.
func writeListRows(w io.Writer, queue string, rows []listRow, total int) bool {
	if len(rows) == 0 {
		fmt.Fprintf(w, "no dead letters in %s\n", queue)
		return false
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tREASON\tATTEMPTS\tFIRST FAILURE\tLAST FAILURE\tAGE\tCONSUMER\tORIGIN\tLAST ERROR")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n",
			cell(r.id, listFieldWidth), cell(string(r.dl.Reason), listFieldWidth), r.dl.Attempts,
			timeCell(r.dl.FirstFailure), timeCell(r.dl.LastFailure), r.age.Round(time.Second),
			cell(r.dl.Consumer, listFieldWidth), cell(r.dl.Origin, listFieldWidth), cell(r.dl.LastError, listErrorWidth))
	}
	tw.Flush()
	if total > len(rows) {
		fmt.Fprintf(w, "showing %d of %d dead letters in %s; raise --limit to see more\n", len(rows), total, queue)
	} else {
		fmt.Fprintf(w, "%d dead letter(s) in %s\n", len(rows), queue)
	}
	return true
}

// deadLetterJSON is one element of "dlq list --json".
type deadLetterJSON struct {
	ID           string       `json:"id"`
	Reason       string       `json:"reason"`
	Attempts     int          `json:"attempts"`
	InfraRetries int          `json:"infra_retries"`
	FirstFailure *time.Time   `json:"first_failure,omitempty"`
	LastFailure  *time.Time   `json:"last_failure,omitempty"`
	LastError    string       `json:"last_error"`
	Consumer     string       `json:"consumer"`
	Origin       string       `json:"origin"`
	Redrives     int          `json:"redrives"`
	Published    *time.Time   `json:"published,omitempty"`
	BodyBytes    int          `json:"body_bytes"`
	XDeath       []xDeathJSON `json:"x_death,omitempty"`
	DeadLetterID string       `json:"dead_letter_id,omitempty"`
	// Copies counts the messages of the queue that carry this dead letter
	// (more than 1: dead-lettered again after a redelivery).
	Copies int `json:"copies"`
}

// repeatCount is how many copies of msgs were not listed.
func repeatCount(msgs []idemamqp.DeadMessage) int {
	n := 0
	for _, m := range msgs {
		n += max(m.Copies-1, 0)
	}
	return n
}

type xDeathJSON struct {
	Queue       string    `json:"queue"`
	Reason      string    `json:"reason"`
	Exchange    string    `json:"exchange"`
	RoutingKeys []string  `json:"routing_keys"`
	Count       int64     `json:"count"`
	Time        time.Time `json:"time"`
}

func writeDeadLettersJSON(w io.Writer, msgs []idemamqp.DeadMessage, bodyBytes []int) error {
	opt := func(t time.Time) *time.Time {
		if t.IsZero() {
			return nil
		}
		t = t.UTC()
		return &t
	}
	out := make([]deadLetterJSON, 0, len(msgs))
	for i, m := range msgs {
		j := deadLetterJSON{
			ID: m.ID, Reason: string(m.Reason), Attempts: m.Attempts, InfraRetries: m.InfraRetries,
			FirstFailure: opt(m.FirstFailure), LastFailure: opt(m.LastFailure), LastError: m.LastError,
			Consumer: m.Consumer, Origin: m.Origin, Redrives: m.Redrives, Published: opt(m.Published),
			BodyBytes: bodyBytes[i], DeadLetterID: m.DeadLetterID, Copies: m.Copies,
		}
		for _, x := range m.XDeath {
			j.XDeath = append(j.XDeath, xDeathJSON{x.Queue, x.Reason, x.Exchange, x.RoutingKeys, x.Count, x.Time.UTC()})
		}
		out = append(out, j)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

func newDLQShowCmd() *cobra.Command {
	var (
		limit    int
		showBody bool
	)
	cmd := &cobra.Command{
		Use:   "show ID",
		Short: "Print one dead letter: why it failed, x-death, every header and the body",
		Long: `Print the dead letter with message id ID: the failure report (reason,
attempts, first and last failure, last error, consumer, origin, RabbitMQ's
x-death history), its properties, every header and a preview of the body (the
first 1 KiB; --body prints all of it). The message stays in the queue.`,
		Args: cobra.ExactArgs(1),
	}
	cfg := addDLQFlags(cmd)
	cmd.Flags().IntVar(&limit, "limit", 10000, "look at most at N dead letters to find ID")
	cmd.Flags().BoolVar(&showBody, "body", false, "print the whole body, not a 1 KiB preview")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if limit < 1 {
			return usageErrorf("--limit must be at least 1, got %d", limit)
		}
		return withDLQ(cmd, cfg, func(t *dlqTarget) error {
			seen, found := 0, 0
			for m, err := range idemamqp.ScanDeadLetters(cmd.Context(), t.conn, t.name, limit) {
				if err != nil {
					return err
				}
				seen++
				if m.ID != args[0] {
					continue
				}
				if found > 0 {
					fmt.Fprintln(cmd.OutOrStdout())
				}
				found++
				writeDeadLetter(cmd.OutOrStdout(), m, showBody, time.Now())
			}
			if found == 0 {
				return fmt.Errorf("message %q not found in %s (looked at %d dead letter(s))", args[0], t.name, seen)
			}
			return nil
		})
	}
	return cmd
}

func writeDeadLetter(w io.Writer, m idemamqp.DeadMessage, wholeBody bool, now time.Time) {
	fmt.Fprintln(w, sanitize(m.Report(now), "\n"))
	if !m.Published.IsZero() {
		fmt.Fprintf(w, "  published: %s\n", m.Published.UTC().Format(time.RFC3339))
	}
	fmt.Fprintln(w, "  headers:")
	for _, k := range slices.Sorted(maps.Keys(m.Headers)) {
		fmt.Fprintf(w, "    %s: %s\n", cell(k, listFieldWidth), headerValue(m.Headers[k]))
	}
	writeBody(w, m.Body, wholeBody)
}

// writeBody prints a dead letter's body: text as indented lines, anything
// else as a hex dump; the first 1 KiB unless whole.
func writeBody(w io.Writer, all []byte, whole bool) {
	body := all
	if !whole && len(body) > bodyPreviewBytes {
		body = body[:bodyPreviewBytes]
	}
	if len(body) == 0 {
		return
	}
	if len(body) < len(all) {
		fmt.Fprintf(w, "  body (first %d of %d bytes; --body for all):\n", len(body), len(all))
	} else {
		fmt.Fprintln(w, "  body:")
	}
	if text, ok := printableText(body); ok {
		for line := range strings.SplitSeq(strings.TrimRight(text, "\n"), "\n") {
			fmt.Fprintf(w, "    %s\n", line)
		}
		return
	}
	io.WriteString(w, hex.Dump(body))
}

// printableText reports whether b (possibly cut inside a rune at the end)
// is text a terminal can show as is.
func printableText(b []byte) (string, bool) {
	for i := 0; i < utf8.UTFMax && len(b) > 0 && !utf8.Valid(b); i++ {
		b = b[:len(b)-1]
	}
	s := string(b)
	if !utf8.ValidString(s) {
		return "", false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) && r != '\n' && r != '\t' && r != '\r' {
			return "", false
		}
	}
	return strings.ReplaceAll(s, "\r", ""), true
}

// headerValue renders an AMQP header value on one bounded line.
func headerValue(v any) string {
	var s string
	switch v := v.(type) {
	case string:
		s = v
	case []byte:
		s = fmt.Sprintf("(%d bytes) %q", len(v), v[:min(len(v), 64)])
	case time.Time:
		s = v.UTC().Format(time.RFC3339)
	case amqp.Table:
		keys := slices.Sorted(maps.Keys(v))
		parts := make([]string, 0, len(keys))
		for _, k := range keys {
			parts = append(parts, k+"="+headerValue(v[k]))
		}
		s = "{" + strings.Join(parts, " ") + "}"
	case []any:
		parts := make([]string, 0, len(v))
		for _, e := range v {
			parts = append(parts, headerValue(e))
		}
		s = "[" + strings.Join(parts, ", ") + "]"
	default:
		s = fmt.Sprint(v)
	}
	return cell(s, headerValueBytes)
}

func newDLQRedriveCmd() *cobra.Command {
	var (
		all         bool
		reason      string
		dryRun      bool
		maxRedrives int
		limit       int
	)
	cmd := &cobra.Command{
		Use:   "redrive (ID... | --all | --reason REASON)",
		Short: "Send chosen dead letters back to the exchange and routing key they were first published to",
		Long: `Send dead letters back to where they were first published, with fresh
attempts: run it after fixing what made them fail. Choose them explicitly, by
message id, --all, or --reason: one of idem's (max_attempts, permanent,
mismatch — id_conflict before — missing_id, invalid_id, no_handler) or
RabbitMQ's own (rejected, expired, maxlen, delivery_limit). Ids or a reason
that match no dead letter are an error (exit 1); --all matching none is not.

Each message is removed from the dead-letter queue only after the broker
confirms its copy. A message redriven --max-redrives times already stays in the
dead letters. --dry-run prints what would move and changes nothing.`,
	}
	cfg := addDLQFlags(cmd)
	cmd.Flags().BoolVar(&all, "all", false, "redrive every dead letter")
	cmd.Flags().StringVar(&reason, "reason", "", "redrive the dead letters with this reason")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "print what would be redriven; change nothing")
	cmd.Flags().IntVar(&maxRedrives, "max-redrives", idemamqp.DefaultMaxRedrives, "leave messages redriven this many times already")
	cmd.Flags().IntVar(&limit, "limit", 1000, "look at most at N dead letters")
	cmd.RunE = func(cmd *cobra.Command, ids []string) error {
		if err := redriveChoice(ids, all, reason, maxRedrives, limit); err != nil {
			return err
		}
		if reason == "id_conflict" { // the old name, in dead letters of earlier versions too
			reason = string(idem.DeadMismatch)
		}
		match := func(m idemamqp.DeadMessage) bool {
			switch {
			case all:
				return true
			case reason != "":
				return string(m.Reason) == reason || reason == string(idem.DeadMismatch) && m.Reason == "id_conflict"
			}
			return slices.Contains(ids, m.ID)
		}
		return withDLQ(cmd, cfg, func(t *dlqTarget) error {
			out := cmd.OutOrStdout()
			var res idemamqp.RedriveResult
			if dryRun {
				for m, err := range idemamqp.ScanDeadLetters(cmd.Context(), t.conn, t.name, limit) {
					if err != nil {
						return err
					}
					switch {
					case !match(m), m.Repeat: // a repeat would be dropped
					case m.Redrives >= maxRedrives:
						res.Capped = append(res.Capped, m.ID)
					default:
						res.Redriven = append(res.Redriven, m.ID)
						fmt.Fprintf(out, "would redrive %s (%s after %d attempt(s)) to %s\n",
							cell(m.ID, listFieldWidth), cell(string(m.Reason), listFieldWidth), m.Attempts, cell(m.Origin, listFieldWidth))
					}
				}
			} else {
				var err error
				res, err = idemamqp.Redrive(cmd.Context(), t.conn, t.name, match,
					&idemamqp.RedriveOptions{MaxRedrives: maxRedrives, Limit: limit})
				for _, id := range res.Redriven {
					fmt.Fprintf(out, "redriven %s\n", cell(id, listFieldWidth))
				}
				for _, id := range res.Dropped {
					fmt.Fprintf(out, "dropped %s: a repeat of a dead letter redriven above\n", cell(id, listFieldWidth))
				}
				if err != nil {
					fmt.Fprintf(out, "redrove %d message(s) from %s before the error\n", len(res.Redriven), t.name)
					return err
				}
			}
			writeRedriveSummary(out, dryRun, res.Redriven, res.Capped, maxRedrives, t.name)
			if reason != "" && len(res.Redriven)+len(res.Capped) == 0 {
				return fmt.Errorf("no dead letter in %s has reason %s", t.name, reason)
			}
			return missingIDs(ids, res.Redriven, res.Capped, t.name)
		})
	}
	return cmd
}

// redriveChoice checks a redrive command line: exactly one of ids, --all
// and --reason, and positive bounds.
func redriveChoice(ids []string, all bool, reason string, maxRedrives, limit int) error {
	chosen := 0
	for _, c := range []bool{len(ids) > 0, all, reason != ""} {
		if c {
			chosen++
		}
	}
	switch {
	case chosen == 0:
		return usageErrorf("choose what to redrive: message ids, --all or --reason REASON")
	case chosen > 1:
		return usageErrorf("give only one of: message ids, --all, --reason")
	case maxRedrives < 1 || limit < 1:
		return usageErrorf("--max-redrives and --limit must be at least 1")
	case reason != "" && !slices.Contains(redriveReasons, reason):
		return usageErrorf("unknown --reason %q, want one of: %s", reason, strings.Join(redriveReasons, ", "))
	}
	return nil
}

// redriveReasons are the reasons --reason accepts: idem's dead-letter
// reasons, the old name of mismatch, RabbitMQ's own x-death reasons and
// idemsqs's name for a message SQS's own redrive policy moved.
var redriveReasons = []string{
	string(idem.DeadMaxAttempts), string(idem.DeadPermanent), string(idem.DeadMismatch), "id_conflict",
	string(idem.DeadMissingID), string(idem.DeadInvalidID), string(idem.DeadNoHandler),
	"rejected", "expired", "maxlen", "delivery_limit", idemsqs.ReasonMaxReceiveCount,
}

// writeRedriveSummary prints the ids kept at the cap and the count moved.
func writeRedriveSummary(out io.Writer, dryRun bool, redriven, capped []string, maxRedrives int, queue string) {
	for _, id := range capped {
		fmt.Fprintf(out, "kept %s: redriven %d time(s) already (--max-redrives)\n", cell(id, listFieldWidth), maxRedrives)
	}
	verb := "redrove"
	if dryRun {
		verb = "dry run: would redrive"
	}
	fmt.Fprintf(out, "%s %d message(s) from %s to their original queue", verb, len(redriven), queue)
	if len(capped) > 0 {
		fmt.Fprintf(out, "; %d kept at the redrive cap", len(capped))
	}
	fmt.Fprintln(out)
}

// missingIDs is the error for explicitly chosen ids that were not redriven:
// not found, or kept at the cap.
func missingIDs(ids, redriven, kept []string, queue string) error {
	var missing, capped []string
	for _, id := range ids {
		switch {
		case slices.Contains(redriven, id):
		case slices.Contains(kept, id):
			capped = append(capped, strconv.Quote(id))
		default:
			missing = append(missing, strconv.Quote(id))
		}
	}
	var errs []string
	if len(missing) > 0 {
		errs = append(errs, fmt.Sprintf("not found in %s: %s", queue, strings.Join(missing, ", ")))
	}
	if len(capped) > 0 {
		errs = append(errs, fmt.Sprintf("kept at the redrive cap: %s", strings.Join(capped, ", ")))
	}
	if len(errs) == 0 {
		return nil
	}
	return errors.New(cell(strings.Join(errs, "; "), headerValueBytes))
}

func newDLQPurgeCmd() *cobra.Command {
	var yes bool
	cmd := &cobra.Command{
		Use:   "purge --yes",
		Short: "Delete every message in the dead-letter queue (needs --yes)",
		Long: `Delete every message in the dead-letter queue. It cannot be undone, so it
refuses to run without --yes. Messages another client holds unacknowledged at
that moment (a concurrent "dlq list") are not deleted.`,
		Args: cobra.NoArgs,
	}
	cfg := addDLQFlags(cmd)
	cmd.Flags().BoolVar(&yes, "yes", false, "really delete every dead letter")
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := cfg.check(); err != nil {
			return err
		}
		if !yes {
			return usageErrorf("purge deletes every message in %s and cannot be undone; add --yes", cfg.deadLetterQueue())
		}
		return withDLQ(cmd, cfg, func(t *dlqTarget) error {
			ch, err := t.conn.Channel()
			if err != nil {
				return fmt.Errorf("open channel: %w", err)
			}
			defer ch.Close()
			n, err := ch.QueuePurge(t.name, false)
			if err != nil {
				return fmt.Errorf("purge %s: %w", t.name, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "purged %d message(s) from %s\n", n, t.name)
			return nil
		})
	}
	return cmd
}

// cell makes s safe for one line of a terminal: control characters become
// spaces, and it is cut to width runes.
func cell(s string, width int) string {
	if s == "" {
		return "-"
	}
	s = sanitize(s, "")
	if utf8.RuneCountInString(s) > width {
		r := []rune(s)
		s = string(r[:width-1]) + "…"
	}
	return s
}

// sanitize replaces the characters a terminal would interpret (escape
// sequences, carriage returns) with spaces; those in keep stay.
func sanitize(s, keep string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) || strings.ContainsRune(keep, r) {
			return r
		}
		return ' '
	}, s)
}

func timeCell(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}
