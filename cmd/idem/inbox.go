package main

import (
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/inbox/inboxdriver"
	"github.com/idem-go/idem/store/idemmysql"
	"github.com/idem-go/idem/store/idempgx"
	"github.com/idem-go/idem/store/idemsqlite"
	"github.com/spf13/cobra"
)

func init() { commands = append(commands, newInboxCmd) }

func newInboxCmd(a *app) *cobra.Command {
	return groupCmd("inbox", "Inspect the inbox: stats, dead letters, redrive and discard",
		inboxStatsCmd(), inboxDeadList.cmd(), newInboxShowCmd(), inboxDead.redriveCmd(), inboxDead.discardCmd())
}

// withInbox opens the store cfg names and runs fn with its inbox.
func withInbox(cmd *cobra.Command, cfg *storeConfig, fn func(inbox.Admin) error) error {
	return withTable(cmd, cfg, "inbox", inboxOf, fn)
}

// inboxOf returns the inbox of s, nil when its backend has none.
func inboxOf(s idem.Store) inbox.Admin {
	switch st := s.(type) {
	case *idempgx.Store:
		return st.Inbox()
	case *idemsqlite.Store:
		return st.Inbox()
	case *idemmysql.Store:
		return st.Inbox()
	}
	return nil
}

// inboxAge prints a duration rounded for people.
func inboxAge(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	if d >= time.Minute {
		return d.Round(time.Second).String()
	}
	return d.Round(time.Millisecond).String()
}

// inboxStatsCmd is "inbox stats".
func inboxStatsCmd() *cobra.Command {
	return statsCmd[inbox.State, inbox.Admin]("inbox", "Count inbox rows by state, with the age of the oldest row in each",
		`Count inbox rows by state, with the age of the oldest row in each. --json
prints [{"state", "count", "oldest_seconds"}].`, withInbox)
}

// flatText flattens an error text for a table cell.
func flatText(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > max {
		s = s[:max] + "…"
	}
	return s
}

// inboxRowJSON is an inbox row in "inbox dead --json" and "inbox show
// --json". The payload is text when it is valid UTF-8, else base64 in
// payload_base64; dead lists carry neither.
type inboxRowJSON struct {
	ID             int64           `json:"id"`
	Source         string          `json:"source"`
	MessageID      string          `json:"message_id"`
	Type           string          `json:"type"`
	OrderingKey    string          `json:"ordering_key,omitempty"`
	State          inbox.State     `json:"state"`
	Attempts       int             `json:"attempts"`
	Token          int64           `json:"token,omitempty"`
	Fingerprint    string          `json:"fingerprint,omitempty"`
	DeadReason     idem.DeadReason `json:"dead_reason,omitempty"`
	LastError      string          `json:"last_error,omitempty"`
	ReceivedAt     *time.Time      `json:"received_at,omitempty"`
	NextAttemptAt  *time.Time      `json:"next_attempt_at,omitempty"`
	LeaseExpiresAt *time.Time      `json:"lease_expires_at,omitempty"`
	ProcessedAt    *time.Time      `json:"processed_at,omitempty"`
	PayloadBytes   int             `json:"payload_bytes"`
	Payload        *string         `json:"payload,omitempty"`
	PayloadBase64  []byte          `json:"payload_base64,omitempty"`
	History        []inboxAttempt  `json:"history,omitempty"`
}

// inboxAttempt is one failed run in "inbox show --json".
type inboxAttempt struct {
	Number int       `json:"number"`
	At     time.Time `json:"at"`
	Error  string    `json:"error"`
}

func inboxRowToJSON(r inbox.Row, withPayload bool) inboxRowJSON {
	j := inboxRowJSON{ID: r.ID, Source: r.Source, MessageID: r.MessageID, Type: r.Type, OrderingKey: r.OrderingKey,
		State: r.State, Attempts: r.Attempts, Token: r.Token, DeadReason: r.DeadReason, LastError: r.LastError,
		ReceivedAt: jsonTime(r.ReceivedAt), NextAttemptAt: jsonTime(r.NextAttemptAt), LeaseExpiresAt: jsonTime(r.LeaseExpiresAt),
		ProcessedAt: jsonTime(r.ProcessedAt), PayloadBytes: len(r.Payload)}
	if r.Fingerprint != (idem.Fingerprint{}) {
		j.Fingerprint = r.Fingerprint.String()
	}
	if withPayload {
		j.Payload, j.PayloadBase64 = jsonPayload(r.Payload)
	}
	return j
}

// inboxDeadList is "inbox dead".
var inboxDeadList = rowList[inbox.State, inbox.Row, inboxRowJSON, inbox.Admin]{
	table: "inbox", state: inbox.StateDead,
	short: "List dead messages with their reason, attempts and last error",
	long: `List dead messages with their reason, attempts and last error, oldest id first;
page with --after. --json prints an array of rows (see "inbox show --json",
without payloads and history).`,
	rows: "dead messages", empty: "no dead messages", maxBatch: inbox.MaxBatch, with: withInbox,
	toJSON: func(r inbox.Row) inboxRowJSON { return inboxRowToJSON(r, false) },
	print: func(tw io.Writer, rows []inbox.Row) {
		fmt.Fprintln(tw, "ID\tSOURCE\tMESSAGE\tTYPE\tATTEMPTS\tREASON\tLAST ERROR")
		for _, r := range rows {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%s\n", r.ID, r.Source, r.MessageID, r.Type, r.Attempts,
				flatText(string(r.DeadReason), 80), flatText(r.LastError, 120))
		}
	},
}

func parseIDs(args []string) ([]int64, error) {
	ids := make([]int64, 0, len(args))
	for _, a := range args {
		id, err := strconv.ParseInt(a, 10, 64)
		if err != nil || id <= 0 {
			return nil, usageErrorf("invalid inbox row id %q: want a positive integer", a)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

func newInboxShowCmd() *cobra.Command {
	var (
		cfg          *storeConfig
		payloadBytes int
		asJSON       bool
	)
	cmd := &cobra.Command{
		Use:   "show ID",
		Short: "Show one inbox row, its payload and its attempt history",
		Long: `Show one inbox row, its payload and its attempt history. The payload is
printed as text when it is valid UTF-8, else as a hex dump, up to
--payload-bytes (0: all). --json prints the row with "payload" (text) or
"payload_base64", and "history".`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ids, err := parseIDs(args)
			if err != nil {
				return err
			}
			return withInbox(cmd, cfg, func(ib inbox.Admin) error {
				r, hist, err := ib.Get(cmd.Context(), ids[0])
				if errors.Is(err, idem.ErrNotFound) {
					return fmt.Errorf("inbox row %d not found in %s", ids[0], redactDSN(cfg.DSN))
				}
				if err != nil {
					return fmt.Errorf("inbox show: %w", err)
				}
				w := cmd.OutOrStdout()
				if asJSON {
					j := inboxRowToJSON(r, true)
					j.History = []inboxAttempt{}
					for _, a := range hist {
						j.History = append(j.History, inboxAttempt{a.Number, a.At.UTC(), a.Error})
					}
					return writeJSON(w, j)
				}
				tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
				for _, f := range [][2]string{
					{"id", fmt.Sprint(r.ID)},
					{"source", fmt.Sprintf("%q", r.Source)},
					{"message id", fmt.Sprintf("%q", r.MessageID)},
					{"type", fmt.Sprintf("%q", r.Type)},
					{"ordering key", fmt.Sprintf("%q", r.OrderingKey)},
					{"state", string(r.State)},
					{"attempts", fmt.Sprint(r.Attempts)},
					{"token", fmt.Sprint(r.Token)},
					{"fingerprint", r.Fingerprint.String()},
					{"received", fmtTime(r.ReceivedAt)},
					{"next attempt", fmtTime(r.NextAttemptAt)},
					{"lease expires", fmtTime(r.LeaseExpiresAt)},
					{"processed", fmtTime(r.ProcessedAt)},
					{"dead reason", string(r.DeadReason)},
					{"last error", flatText(r.LastError, inboxdriver.MaxErrorBytes)},
					{"payload", fmt.Sprintf("%d bytes", len(r.Payload))},
				} {
					fmt.Fprintf(tw, "%s\t%s\n", f[0], f[1])
				}
				if err := tw.Flush(); err != nil {
					return err
				}
				printBytes(w, "payload", "--payload-bytes", r.Payload, payloadBytes)
				fmt.Fprintf(w, "\nattempts (%d):\n", len(hist))
				tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
				fmt.Fprintln(tw, "#\tAT\tERROR")
				for _, a := range hist {
					fmt.Fprintf(tw, "%d\t%s\t%s\n", a.Number, fmtTime(a.At), flatText(a.Error, inboxdriver.MaxErrorBytes))
				}
				return tw.Flush()
			})
		},
	}
	cfg = addStoreFlags(cmd)
	cmd.Flags().IntVar(&payloadBytes, "payload-bytes", 4096, "print at most this many bytes of the payload (0: all)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON, for scripts")
	return cmd
}

// printBytes prints b under title, bounded to max bytes (0: all): as text
// when it is valid UTF-8, else as a hex dump; flag is the flag that shows
// more.
func printBytes(w io.Writer, title, flag string, b []byte, max int) {
	if len(b) == 0 {
		return
	}
	shown := b
	if max > 0 && len(shown) > max {
		shown = shown[:max]
	}
	if utf8.Valid(b) {
		for !utf8.Valid(shown) { // a cut inside a character
			shown = shown[:len(shown)-1]
		}
		fmt.Fprintf(w, "\n%s (text):\n%s\n", title, shown)
	} else {
		fmt.Fprintf(w, "\n%s (binary, hex):\n%s", title, hex.Dump(shown))
	}
	if len(shown) < len(b) {
		fmt.Fprintf(w, "… %d more bytes (%s 0 shows all)\n", len(b)-len(shown), flag)
	}
}

// inboxDead holds the inbox's redrive and discard commands.
var inboxDead = deadRows[inbox.Select, inbox.Admin]{
	table: "inbox", noun: "message", maxBatch: inbox.MaxBatch, with: withInbox,
	sel:          func(ids []int64, all bool) inbox.Select { return inbox.Select{IDs: ids, All: all} },
	redriveShort: "Move dead messages back to pending with attempts reset, due now",
	discardShort: "Delete dead messages for good (needs --yes)",
}
