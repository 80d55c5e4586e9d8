package main

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/outbox"
	"github.com/idem-go/idem/outbox/outboxdriver"
	"github.com/idem-go/idem/store/idemmysql"
	"github.com/idem-go/idem/store/idempgx"
	"github.com/idem-go/idem/store/idemsqlite"
	"github.com/spf13/cobra"
)

func init() { commands = append(commands, newOutboxCmd) }

func newOutboxCmd(a *app) *cobra.Command {
	return groupCmd("outbox", "Inspect the outbox: stats, pending and dead events, redrive, discard and purge",
		outboxStatsCmd(), outboxList(outbox.StatePending).cmd(), outboxList(outbox.StateDead).cmd(), newOutboxShowCmd(),
		outboxDead.redriveCmd(), outboxDead.discardCmd(), newOutboxPurgeCmd())
}

// withOutbox opens the store cfg names and runs fn with its outbox.
func withOutbox(cmd *cobra.Command, cfg *storeConfig, fn func(outbox.Admin) error) error {
	return withTable(cmd, cfg, "outbox", outboxOf, fn)
}

// outboxOf returns the outbox of s, nil when its backend has none.
func outboxOf(s idem.Store) outbox.Admin {
	switch st := s.(type) {
	case *idempgx.Store:
		return st.Outbox()
	case *idemsqlite.Store:
		return st.Outbox()
	case *idemmysql.Store:
		return st.Outbox()
	}
	return nil
}

// outboxStatsCmd is "outbox stats".
func outboxStatsCmd() *cobra.Command {
	return statsCmd[outbox.State, outbox.Admin]("outbox", "Count outbox events by state, with the age of the oldest event in each",
		`Count outbox events by state (pending, sending, sent, dead), with the age of
the oldest event in each: an old pending event means the relay is not
keeping up or not running; any dead event needs an operator. --json prints
[{"state", "count", "oldest_seconds"}].`, withOutbox)
}

// outboxRowJSON is an outbox event in "outbox pending|dead --json" and
// "outbox show --json". The payload is text when it is valid UTF-8, else
// base64 in payload_base64; lists carry neither.
type outboxRowJSON struct {
	ID             int64             `json:"id"`
	EventID        string            `json:"event_id"`
	Topic          string            `json:"topic"`
	Key            string            `json:"key,omitempty"`
	State          outbox.State      `json:"state"`
	Attempts       int               `json:"attempts"`
	Token          int64             `json:"token,omitempty"`
	DeadReason     idem.DeadReason   `json:"dead_reason,omitempty"`
	LastError      string            `json:"last_error,omitempty"`
	Headers        map[string]string `json:"headers,omitempty"`
	CreatedAt      *time.Time        `json:"created_at,omitempty"`
	NextAttemptAt  *time.Time        `json:"next_attempt_at,omitempty"`
	LeaseExpiresAt *time.Time        `json:"lease_expires_at,omitempty"`
	LastAttemptAt  *time.Time        `json:"last_attempt_at,omitempty"`
	FinishedAt     *time.Time        `json:"finished_at,omitempty"`
	PayloadBytes   int               `json:"payload_bytes"`
	Payload        *string           `json:"payload,omitempty"`
	PayloadBase64  []byte            `json:"payload_base64,omitempty"`
}

func outboxRowToJSON(r outbox.Row, withPayload bool) outboxRowJSON {
	j := outboxRowJSON{ID: r.ID, EventID: r.EventID, Topic: r.Topic, Key: r.Key, State: r.State, Attempts: r.Attempts,
		Token: r.Token, DeadReason: r.DeadReason, LastError: r.LastError, CreatedAt: jsonTime(r.CreatedAt),
		NextAttemptAt: jsonTime(r.NextAttemptAt), LeaseExpiresAt: jsonTime(r.LeaseExpiresAt),
		LastAttemptAt: jsonTime(r.LastAttemptAt), FinishedAt: jsonTime(r.FinishedAt), PayloadBytes: len(r.Payload)}
	if withPayload {
		j.Headers = r.Headers
		j.Payload, j.PayloadBase64 = jsonPayload(r.Payload)
	}
	return j
}

// outboxList is "outbox pending" or "outbox dead".
func outboxList(state outbox.State) rowList[outbox.State, outbox.Row, outboxRowJSON, outbox.Admin] {
	short := "List pending events (committed, not yet confirmed by the broker) with their attempts and last error"
	if state == outbox.StateDead {
		short = "List dead events with their reason, attempts and last error"
	}
	return rowList[outbox.State, outbox.Row, outboxRowJSON, outbox.Admin]{
		table: "outbox", state: state, short: short,
		long: short + `, oldest id first;
page with --after. --json prints an array of events (see "outbox show --json",
without payloads and headers).`,
		rows: "events", empty: fmt.Sprintf("no %s events", state), maxBatch: outbox.MaxBatch, with: withOutbox,
		toJSON: func(r outbox.Row) outboxRowJSON { return outboxRowToJSON(r, false) },
		print: func(tw io.Writer, rows []outbox.Row) {
			if state == outbox.StateDead {
				fmt.Fprintln(tw, "ID\tEVENT\tTOPIC\tKEY\tATTEMPTS\tREASON\tDIED\tLAST ERROR")
				for _, r := range rows {
					fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", r.ID, r.EventID, flatText(r.Topic, 60), flatText(r.Key, 40),
						r.Attempts, flatText(string(r.DeadReason), 40), fmtTime(r.FinishedAt), flatText(r.LastError, 120))
				}
				return
			}
			fmt.Fprintln(tw, "ID\tEVENT\tTOPIC\tKEY\tATTEMPTS\tCREATED\tNEXT ATTEMPT\tLAST ERROR")
			for _, r := range rows {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", r.ID, r.EventID, flatText(r.Topic, 60), flatText(r.Key, 40),
					r.Attempts, fmtTime(r.CreatedAt), fmtTime(r.NextAttemptAt), flatText(r.LastError, 120))
			}
		},
	}
}

// findOutboxRow finds an event by row id or, when arg is not a row id of
// the outbox, by event id (the id the relay's logs and the broker show).
func findOutboxRow(cmd *cobra.Command, ob outbox.Admin, arg string) (outbox.Row, error) {
	if id, err := strconv.ParseInt(arg, 10, 64); err == nil && id > 0 {
		r, err := ob.Get(cmd.Context(), id)
		if !errors.Is(err, idem.ErrNotFound) {
			return r, err
		}
	}
	return ob.GetByEventID(cmd.Context(), arg)
}

func newOutboxShowCmd() *cobra.Command {
	var (
		cfg          *storeConfig
		payloadBytes int
		asJSON       bool
	)
	cmd := &cobra.Command{
		Use:   "show ID|EVENT-ID",
		Short: "Show one outbox event: its state, attempts, last error, headers and payload",
		Long: `Show one outbox event, by its row id or by its event id (the id the relay
logs and the broker carries as message id). The payload is printed as text
when it is valid UTF-8, else as a hex dump, up to --payload-bytes (0: all).
--json prints the event with "headers" and "payload" (text) or
"payload_base64".`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if args[0] == "" || len(args[0]) > outbox.MaxIDLen {
				return usageErrorf("invalid outbox event %q: want a row id or an event id of 1-%d bytes", args[0], outbox.MaxIDLen)
			}
			return withOutbox(cmd, cfg, func(ob outbox.Admin) error {
				r, err := findOutboxRow(cmd, ob, args[0])
				if errors.Is(err, idem.ErrNotFound) {
					return fmt.Errorf("outbox event %q not found in %s", args[0], redactDSN(cfg.DSN))
				}
				if err != nil {
					return fmt.Errorf("outbox show: %w", err)
				}
				w := cmd.OutOrStdout()
				if asJSON {
					return writeJSON(w, outboxRowToJSON(r, true))
				}
				tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
				for _, f := range [][2]string{
					{"id", fmt.Sprint(r.ID)},
					{"event id", fmt.Sprintf("%q", r.EventID)},
					{"topic", fmt.Sprintf("%q", r.Topic)},
					{"key", fmt.Sprintf("%q", r.Key)},
					{"state", string(r.State)},
					{"attempts", fmt.Sprint(r.Attempts)},
					{"token", fmt.Sprint(r.Token)},
					{"created", fmtTime(r.CreatedAt)},
					{"next attempt", fmtTime(r.NextAttemptAt)},
					{"lease expires", fmtTime(r.LeaseExpiresAt)},
					{"last attempt", fmtTime(r.LastAttemptAt)},
					{"finished", fmtTime(r.FinishedAt)},
					{"dead reason", string(r.DeadReason)},
					{"last error", flatText(r.LastError, outboxdriver.MaxErrorBytes)},
					{"headers", fmt.Sprint(len(r.Headers))},
					{"payload", fmt.Sprintf("%d bytes", len(r.Payload))},
				} {
					fmt.Fprintf(tw, "%s\t%s\n", f[0], f[1])
				}
				for _, k := range slices.Sorted(maps.Keys(r.Headers)) {
					fmt.Fprintf(tw, "  %s\t%q\n", k, r.Headers[k])
				}
				if err := tw.Flush(); err != nil {
					return err
				}
				printBytes(w, "payload", "--payload-bytes", r.Payload, payloadBytes)
				return nil
			})
		},
	}
	cfg = addStoreFlags(cmd)
	cmd.Flags().IntVar(&payloadBytes, "payload-bytes", 4096, "print at most this many bytes of the payload (0: all)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON, for scripts")
	return cmd
}

func newOutboxPurgeCmd() *cobra.Command {
	var (
		cfg       *storeConfig
		olderThan time.Duration
		batch     int
		yes       bool
	)
	cmd := &cobra.Command{
		Use:   "purge --older-than DURATION --yes",
		Short: "Delete sent events older than a duration, in batches (needs --yes)",
		Long: `Delete sent events whose broker confirmation is older than --older-than, at
most --batch rows per transaction, until none is left. Pending and dead
events are never purged. A running relay does the same every
PurgeInterval with its Retention.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if olderThan < 0 {
				return usageErrorf("--older-than must not be negative, got %v", olderThan)
			}
			if batch < 1 || batch > outbox.MaxBatch {
				return usageErrorf("--batch must be 1..%d, got %d", outbox.MaxBatch, batch)
			}
			if !yes {
				return usageErrorf("purge would delete the sent events older than %v in %s; add --yes to confirm", olderThan, redactDSN(cfg.DSN))
			}
			return withOutbox(cmd, cfg, func(ob outbox.Admin) error {
				n, err := ob.PurgeSent(cmd.Context(), olderThan, batch)
				if err != nil {
					return fmt.Errorf("outbox purge: %w (%d deleted before the failure)", err, n)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "purged %d sent event(s)\n", n)
				return nil
			})
		},
	}
	cfg = addStoreFlags(cmd)
	cmd.Flags().DurationVar(&olderThan, "older-than", outbox.DefaultRetention, "purge sent events confirmed longer ago than this")
	cmd.Flags().IntVar(&batch, "batch", outbox.DefaultPurgeBatch, "rows deleted per transaction")
	cmd.Flags().BoolVar(&yes, "yes", false, "confirm the deletion")
	return cmd
}

// outboxDead holds the outbox's redrive and discard commands.
var outboxDead = deadRows[outbox.Select, outbox.Admin]{
	table: "outbox", noun: "event", maxBatch: outbox.MaxBatch, with: withOutbox,
	sel:          func(ids []int64, all bool) outbox.Select { return outbox.Select{IDs: ids, All: all} },
	redriveShort: "Move dead events back to pending with attempts reset, due now (the relay publishes them again)",
	discardShort: "Delete dead events for good, never publishing them (needs --yes)",
	discardFate:  " (they are never published)",
}
