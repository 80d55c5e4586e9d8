package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"unicode/utf8"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/statetable"
	"github.com/spf13/cobra"
)

// deadAdmin is what "redrive" and "discard" need of a table with dead rows:
// inbox.Admin and outbox.Admin, over their own selection types.
type deadAdmin[S any] interface {
	Redrive(ctx context.Context, sel S) (int64, error)
	Discard(ctx context.Context, sel S) (int64, error)
}

// deadRows builds the redrive and discard commands that the inbox and the
// outbox share: rows chosen by id or --all, a discard confirmed by --yes,
// and a failure when some ids given were not dead rows.
type deadRows[S any, A deadAdmin[S]] struct {
	table    string // "inbox", "outbox"
	noun     string // "message", "event"
	maxBatch int
	// with opens the store named by cfg and hands over its admin.
	with func(cmd *cobra.Command, cfg *storeConfig, fn func(A) error) error
	// sel makes the table's selection.
	sel func(ids []int64, all bool) S
	// redriveShort and discardShort are the commands' one-line help;
	// discardFate says what a discard does beyond deleting ("" or, e.g.,
	// " (they are never published)").
	redriveShort, discardShort, discardFate string
}

// parseIDs turns row id arguments into ids.
func (d deadRows[S, A]) parseIDs(args []string) ([]int64, error) {
	ids := make([]int64, 0, len(args))
	for _, a := range args {
		id, err := strconv.ParseInt(a, 10, 64)
		if err != nil || id <= 0 {
			return nil, usageErrorf("invalid %s row id %q: want a positive integer (see %s dead)", d.table, a, d.table)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// selection turns row id arguments and --all into a selection.
func (d deadRows[S, A]) selection(args []string, all bool) (S, error) {
	var zero S
	if all == (len(args) > 0) {
		return zero, usageErrorf("give %s row ids or --all (not both)", d.table)
	}
	if len(args) > d.maxBatch {
		return zero, usageErrorf("at most %d ids at once; use --all", d.maxBatch)
	}
	ids, err := d.parseIDs(args)
	if err != nil {
		return zero, err
	}
	return d.sel(ids, all), nil
}

// unmatched fails a redrive or discard of ids of which only n were dead
// rows (a row that is not dead, or gone, is left alone): the operator asked
// for something that did not happen. --all matching nothing is no failure:
// no dead rows is the normal state.
func (d deadRows[S, A]) unmatched(op string, ids int, all bool, n int64) error {
	if all || n >= int64(ids) {
		return nil
	}
	return fmt.Errorf("%s %s: %d of the %d ids given are not dead %ss (see %s show ID); nothing was done to them",
		d.table, op, int64(ids)-n, ids, d.noun, d.table)
}

// apply runs op ("redrive" or "discard") on the selected rows and reports
// how many it moved.
func (d deadRows[S, A]) apply(cmd *cobra.Command, cfg *storeConfig, op, done string, args []string, all bool,
	run func(A, context.Context, S) (int64, error)) error {
	sel, err := d.selection(args, all)
	if err != nil {
		return err
	}
	return d.with(cmd, cfg, func(a A) error {
		n, err := run(a, cmd.Context(), sel)
		if err != nil {
			return fmt.Errorf("%s %s: %w", d.table, op, err)
		}
		fmt.Fprintf(cmd.OutOrStdout(), "%s %d dead %s(s)\n", done, n, d.noun)
		return d.unmatched(op, len(args), all, n)
	})
}

func (d deadRows[S, A]) redriveCmd() *cobra.Command {
	var (
		cfg *storeConfig
		all bool
	)
	cmd := &cobra.Command{
		Use:   "redrive [ID...]",
		Short: d.redriveShort,
		RunE: func(cmd *cobra.Command, args []string) error {
			return d.apply(cmd, cfg, "redrive", "redrove", args, all, func(a A, ctx context.Context, sel S) (int64, error) { return a.Redrive(ctx, sel) })
		},
	}
	cfg = addStoreFlags(cmd)
	cmd.Flags().BoolVar(&all, "all", false, "redrive every dead "+d.noun)
	return cmd
}

func (d deadRows[S, A]) discardCmd() *cobra.Command {
	var (
		cfg      *storeConfig
		all, yes bool
	)
	cmd := &cobra.Command{
		Use:   "discard [ID...] --yes",
		Short: d.discardShort,
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := d.selection(args, all); err != nil {
				return err
			}
			if !yes {
				what := "the dead " + d.noun + "s with the ids given"
				if all {
					what = "every dead " + d.noun
				}
				return usageErrorf("discard would delete %s in %s for good%s; add --yes to confirm", what, redactDSN(cfg.DSN), d.discardFate)
			}
			return d.apply(cmd, cfg, "discard", "discarded", args, all, func(a A, ctx context.Context, sel S) (int64, error) { return a.Discard(ctx, sel) })
		},
	}
	cfg = addStoreFlags(cmd)
	cmd.Flags().BoolVar(&all, "all", false, "discard every dead "+d.noun)
	cmd.Flags().BoolVar(&yes, "yes", false, "confirm the deletion")
	return cmd
}

// The "stats" and the row list commands ("inbox dead", "outbox pending",
// "outbox dead") that the inbox and the outbox share, generic over the
// table's state (St), row (R) and admin (A).

// withTable opens the store cfg names and runs fn with its table (the
// inbox or the outbox), which of returns (nil when the store's backend has
// none).
func withTable[A comparable](cmd *cobra.Command, cfg *storeConfig, table string, of func(idem.Store) A, fn func(A) error) error {
	return withStore(cmd, cfg, func(s idem.Store) error {
		var none A
		if a := of(s); a != none {
			return fn(a)
		}
		return fmt.Errorf("the store %s has no %s (the %s needs sqlite://, postgres:// or mysql://)", redactDSN(cfg.DSN), table, table)
	})
}

// jsonPayload is a payload in a row's JSON: text when it is valid UTF-8,
// else bytes for "payload_base64".
func jsonPayload(b []byte) (text *string, binary []byte) {
	if utf8.Valid(b) {
		s := string(b)
		return &s, nil
	}
	return nil, b
}

// statJSON is one element of "<table> stats --json".
type statJSON[St ~string] struct {
	State         St      `json:"state"`
	Count         int64   `json:"count"`
	OldestSeconds float64 `json:"oldest_seconds"`
}

// statsCmd is "<table> stats": rows counted by state with the age of the
// oldest in each, as a table or JSON.
func statsCmd[St ~string, A interface {
	Stats(ctx context.Context) ([]statetable.Count[St], error)
}](table, short, long string, with func(cmd *cobra.Command, cfg *storeConfig, fn func(A) error) error) *cobra.Command {
	var (
		cfg    *storeConfig
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "stats",
		Short: short,
		Long:  long,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return with(cmd, cfg, func(a A) error {
				st, err := a.Stats(cmd.Context())
				if err != nil {
					return fmt.Errorf("%s stats: %w", table, err)
				}
				if asJSON {
					out := make([]statJSON[St], len(st))
					for i, c := range st {
						out[i] = statJSON[St]{c.State, c.Count, c.Oldest.Seconds()}
					}
					return writeJSON(cmd.OutOrStdout(), out)
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
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON, for scripts")
	return cmd
}

// rowList describes a "<table> <state>" command that lists the rows in a
// state, oldest id first, paged with --after.
type rowList[St ~string, R, J any, A interface {
	List(ctx context.Context, req statetable.ListRequest[St]) ([]R, error)
}] struct {
	table       string
	state       St
	short, long string
	// rows names the rows in the flags' help and in the empty answer
	// ("dead messages", "events").
	rows string
	// empty is the answer when none is listed ("no dead messages").
	empty    string
	maxBatch int
	with     func(cmd *cobra.Command, cfg *storeConfig, fn func(A) error) error
	// toJSON is a row in --json, print the table's header and lines.
	toJSON func(R) J
	print  func(w io.Writer, rows []R)
}

func (l rowList[St, R, J, A]) cmd() *cobra.Command {
	var (
		cfg    *storeConfig
		limit  int
		after  int64
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   string(l.state),
		Short: l.short,
		Long:  l.long,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if limit < 1 || limit > l.maxBatch {
				return usageErrorf("--limit must be 1..%d, got %d", l.maxBatch, limit)
			}
			return l.with(cmd, cfg, func(a A) error {
				rows, err := a.List(cmd.Context(), statetable.ListRequest[St]{State: l.state, AfterID: after, Limit: limit})
				if err != nil {
					return fmt.Errorf("%s %s: %w", l.table, l.state, err)
				}
				if asJSON {
					out := make([]J, len(rows))
					for i, r := range rows {
						out[i] = l.toJSON(r)
					}
					return writeJSON(cmd.OutOrStdout(), out)
				}
				if len(rows) == 0 {
					if after > 0 {
						fmt.Fprintf(cmd.OutOrStdout(), "%s after id %d\n", l.empty, after)
					} else {
						fmt.Fprintln(cmd.OutOrStdout(), l.empty)
					}
					return nil
				}
				tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
				l.print(tw, rows)
				return tw.Flush()
			})
		},
	}
	cfg = addStoreFlags(cmd)
	cmd.Flags().IntVar(&limit, "limit", 100, "how many "+l.rows+" to list")
	cmd.Flags().Int64Var(&after, "after", 0, "list "+l.rows+" with an id above this one (paging)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON, for scripts")
	return cmd
}
