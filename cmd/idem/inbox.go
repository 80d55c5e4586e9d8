package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/inbox/inboxdriver"
	"github.com/idem-go/idem/store/idempgx"
	"github.com/idem-go/idem/store/idemsqlite"
	"github.com/spf13/cobra"
)

func init() { commands = append(commands, newInboxCmd) }

func newInboxCmd(a *app) *cobra.Command {
	return groupCmd("inbox", "Inspect the inbox: stats, dead letters, redrive and discard",
		newInboxStatsCmd(), newInboxDeadCmd(), newInboxShowCmd(), newInboxRedriveCmd(), newInboxDiscardCmd())
}

// withInbox opens the store cfg names and runs fn with its inbox.
func withInbox(cmd *cobra.Command, cfg *storeConfig, fn func(inbox.Admin) error) error {
	return withStore(cmd, cfg, func(s idem.Store) error {
		switch st := s.(type) {
		case *idempgx.Store:
			return fn(st.Inbox())
		case *idemsqlite.Store:
			return fn(st.Inbox())
		}
		return fmt.Errorf("the store %s has no inbox (the inbox needs sqlite:// or postgres://)", redactDSN(cfg.DSN))
	})
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

func newInboxStatsCmd() *cobra.Command {
	var cfg *storeConfig
	cmd := &cobra.Command{
		Use:   "stats",
		Short: "Count inbox rows by state, with the age of the oldest row in each",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withInbox(cmd, cfg, func(ib inbox.Admin) error {
				st, err := ib.Stats(cmd.Context())
				if err != nil {
					return fmt.Errorf("inbox stats: %w", err)
				}
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
				fmt.Fprintln(tw, "STATE\tCOUNT\tOLDEST")
				for _, c := range st {
					fmt.Fprintf(tw, "%s\t%d\t%s\n", c.State, c.Count, inboxAge(c.Oldest))
				}
				return tw.Flush()
			})
		},
	}
	cfg = addStoreFlags(cmd)
	return cmd
}

// flatText flattens an error text for a table cell.
func flatText(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > max {
		s = s[:max] + "…"
	}
	return s
}

func newInboxDeadCmd() *cobra.Command {
	var (
		cfg   *storeConfig
		limit int
		after int64
	)
	cmd := &cobra.Command{
		Use:   "dead",
		Short: "List dead messages with their reason, attempts and last error",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if limit < 1 || limit > inbox.MaxBatch {
				return usageErrorf("--limit must be 1..%d, got %d", inbox.MaxBatch, limit)
			}
			return withInbox(cmd, cfg, func(ib inbox.Admin) error {
				rows, err := ib.List(cmd.Context(), inbox.ListRequest{State: inbox.StateDead, AfterID: after, Limit: limit})
				if err != nil {
					return fmt.Errorf("inbox dead: %w", err)
				}
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
				fmt.Fprintln(tw, "ID\tSOURCE\tMESSAGE\tTYPE\tATTEMPTS\tREASON\tLAST ERROR")
				for _, r := range rows {
					fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%s\n", r.ID, r.Source, r.MessageID, r.Type, r.Attempts,
						flatText(string(r.DeadReason), 80), flatText(r.LastError, 120))
				}
				return tw.Flush()
			})
		},
	}
	cfg = addStoreFlags(cmd)
	cmd.Flags().IntVar(&limit, "limit", 100, "how many dead messages to list")
	cmd.Flags().Int64Var(&after, "after", 0, "list dead messages with an id above this one (paging)")
	return cmd
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
	var cfg *storeConfig
	cmd := &cobra.Command{
		Use:   "show ID",
		Short: "Show one inbox row and its attempt history",
		Args:  cobra.ExactArgs(1),
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
	return cmd
}

// selection turns ID arguments and --all into an inbox.Select.
func selection(args []string, all bool) (inbox.Select, error) {
	if all == (len(args) > 0) {
		return inbox.Select{}, usageErrorf("give inbox row ids or --all (not both)")
	}
	if len(args) > inbox.MaxBatch {
		return inbox.Select{}, usageErrorf("at most %d ids at once; use --all", inbox.MaxBatch)
	}
	ids, err := parseIDs(args)
	return inbox.Select{IDs: ids, All: all}, err
}

func newInboxRedriveCmd() *cobra.Command {
	var (
		cfg *storeConfig
		all bool
	)
	cmd := &cobra.Command{
		Use:   "redrive [ID...]",
		Short: "Move dead messages back to pending with attempts reset, due now",
		RunE: func(cmd *cobra.Command, args []string) error {
			sel, err := selection(args, all)
			if err != nil {
				return err
			}
			return withInbox(cmd, cfg, func(ib inbox.Admin) error {
				n, err := ib.Redrive(cmd.Context(), sel)
				if err != nil {
					return fmt.Errorf("inbox redrive: %w", err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "redrove %d dead message(s)\n", n)
				return nil
			})
		},
	}
	cfg = addStoreFlags(cmd)
	cmd.Flags().BoolVar(&all, "all", false, "redrive every dead message")
	return cmd
}

func newInboxDiscardCmd() *cobra.Command {
	var (
		cfg      *storeConfig
		all, yes bool
	)
	cmd := &cobra.Command{
		Use:   "discard [ID...] --yes",
		Short: "Delete dead messages for good (needs --yes)",
		RunE: func(cmd *cobra.Command, args []string) error {
			sel, err := selection(args, all)
			if err != nil {
				return err
			}
			if !yes {
				return usageErrorf("discard deletes dead messages for good; add --yes to confirm")
			}
			return withInbox(cmd, cfg, func(ib inbox.Admin) error {
				n, err := ib.Discard(cmd.Context(), sel)
				if err != nil {
					return fmt.Errorf("inbox discard: %w", err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "discarded %d dead message(s)\n", n)
				return nil
			})
		},
	}
	cfg = addStoreFlags(cmd)
	cmd.Flags().BoolVar(&all, "all", false, "discard every dead message")
	cmd.Flags().BoolVar(&yes, "yes", false, "confirm the deletion")
	return cmd
}
