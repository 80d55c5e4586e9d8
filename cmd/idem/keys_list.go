package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/idem-go/idem"
	"github.com/spf13/cobra"
)

// keySelector is the filter flags of "keys list" and "keys delete".
type keySelector struct {
	key, keyPrefix, scope, scopePrefix, scopeHash, state string
	olderThan, newerThan                                 time.Duration
}

// addSelectorFlags adds the filter flags; withScope adds --scope too
// (keys delete has its own, the scope of its KEY argument).
func addSelectorFlags(cmd *cobra.Command, withScope bool) *keySelector {
	sel := &keySelector{}
	f := cmd.Flags()
	if withScope {
		f.StringVar(&sel.scope, "scope", "", "records of this scope only")
	}
	f.StringVar(&sel.key, "key", "", "records of this key, in every scope")
	f.StringVar(&sel.keyPrefix, "key-prefix", "", "records whose key starts with this")
	f.StringVar(&sel.scopePrefix, "scope-prefix", "", `records whose scope starts with this (e.g. "http " for the HTTP middleware and proxy)`)
	f.StringVar(&sel.scopeHash, "scope-hash", "", "records whose scope has this hash: the scope_hash of the proxy's and middleware's logs (16 hex digits)")
	f.StringVar(&sel.state, "state", "", "in_progress or completed")
	f.DurationVar(&sel.olderThan, "older-than", 0, "records created more than this long ago (e.g. 24h)")
	f.DurationVar(&sel.newerThan, "newer-than", 0, "records created less than this long ago (e.g. 15m)")
	return sel
}

// any reports whether a selector flag was given.
func (s *keySelector) any() bool {
	return *s != keySelector{}
}

// filter checks the flags and turns them into a filter, with the time
// bounds measured from now.
func (s *keySelector) filter(now time.Time) (idem.ListFilter, error) {
	f := idem.ListFilter{Key: s.key, KeyPrefix: s.keyPrefix, Scope: s.scope, ScopePrefix: s.scopePrefix,
		ScopeHash: strings.ToLower(s.scopeHash), State: idem.State(strings.ReplaceAll(s.state, "-", "_"))}
	if s.olderThan < 0 || s.newerThan < 0 {
		return f, usageErrorf("--older-than and --newer-than must not be negative")
	}
	if s.olderThan > 0 {
		f.CreatedBefore = now.Add(-s.olderThan)
	}
	if s.newerThan > 0 {
		f.CreatedAfter = now.Add(-s.newerThan)
	}
	if f.Key != "" {
		if err := idem.ValidateKey(f.Key); err != nil {
			return f, usageError{fmt.Errorf("--key: %w", err)}
		}
	}
	if _, err := idem.ValidateList(idem.ListRequest{Filter: f}); err != nil {
		return f, usageError{flagWords(err)}
	}
	return f, nil
}

// flagWords names the flags in ValidateList's message.
func flagWords(err error) error {
	msg := strings.NewReplacer("list state", "--state", "a scope hash is 16 lowercase hex digits", "--scope-hash must be 16 hex digits (the scope_hash of a log line)").Replace(err.Error())
	return errors.New(strings.TrimPrefix(msg, idem.ErrInvalidConfig.Error()+": "))
}

// withLister opens the store cfg names, checks that it can list its
// records and runs fn.
func withLister(cmd *cobra.Command, cfg *storeConfig, fn func(idem.Store, idem.Lister) error) error {
	b, err := lookupBackend(cfg.DSN)
	if err != nil {
		return err
	}
	return withStore(cmd, cfg, func(s idem.Store) error {
		l, ok := s.(idem.Lister)
		if !ok {
			return fmt.Errorf("%s stores cannot list their records yet", b.Name)
		}
		return fn(s, l)
	})
}

// collect reads pages of the listing until it has limit records (0: all)
// or the listing ends, and returns the cursor to go on from ("" at the
// end). A store bounds the work of one page, so pages may be short.
func collect(ctx context.Context, l idem.Lister, f idem.ListFilter, limit int, cursor string) ([]idem.Record, string, error) {
	var recs []idem.Record
	for {
		n := idem.MaxListLimit
		if limit > 0 {
			n = min(n, limit-len(recs))
		}
		page, err := l.List(ctx, idem.ListRequest{Filter: f, Limit: n, Cursor: cursor})
		if err != nil {
			return recs, cursor, err
		}
		recs = append(recs, page.Records...)
		cursor = page.Next
		if cursor == "" || limit > 0 && len(recs) >= limit {
			return recs, cursor, nil
		}
	}
}

// listedJSON is one record in the --json output of keys list, find and
// delete: a record without its result (keys get shows that).
type listedJSON struct {
	Scope          string     `json:"scope"`
	ScopeHash      string     `json:"scope_hash"`
	Key            string     `json:"key"`
	State          idem.State `json:"state"`
	Token          int64      `json:"token"`
	Fingerprint    string     `json:"fingerprint"`
	CreatedAt      *time.Time `json:"created_at,omitempty"`
	LeaseExpiresAt *time.Time `json:"lease_expires_at,omitempty"`
	CompletedAt    *time.Time `json:"completed_at,omitempty"`
	ExpiresAt      *time.Time `json:"expires_at,omitempty"`
	Failed         bool       `json:"failed"`
	Tombstone      bool       `json:"tombstone"`
}

// listJSON is the --json output of keys list and find.
type listJSON struct {
	Store   string       `json:"store"`
	Records []listedJSON `json:"records"`
	// Next is the --cursor of the next page; empty when the listing is
	// complete.
	Next string `json:"next_cursor"`
}

func toListedJSON(recs []idem.Record) []listedJSON {
	out := make([]listedJSON, 0, len(recs))
	for _, r := range recs {
		out = append(out, listedJSON{
			Scope: r.Scope, ScopeHash: idem.ScopeHash(r.Scope), Key: r.Key, State: r.State, Token: r.Token,
			Fingerprint: r.Fingerprint.String(), CreatedAt: jsonTime(r.CreatedAt), LeaseExpiresAt: jsonTime(r.LeaseExpiresAt),
			CompletedAt: jsonTime(r.CompletedAt), ExpiresAt: jsonTime(r.ExpiresAt), Failed: r.Failed, Tombstone: r.Tombstone,
		})
	}
	return out
}

// writeListed prints records as a table, one a line.
func writeListed(w io.Writer, recs []idem.Record) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SCOPE\tKEY\tSTATE\tCREATED\tEXPIRES\tSCOPE HASH\tNOTE")
	for _, r := range recs {
		var note []string
		if r.Failed {
			note = append(note, "failed")
		}
		if r.Tombstone {
			note = append(note, "tombstone")
		}
		if r.State == idem.StateInProgress && !r.LeaseExpiresAt.IsZero() && time.Until(r.LeaseExpiresAt) < 0 {
			note = append(note, "lease expired")
		}
		fmt.Fprintf(tw, "%q\t%q\t%s\t%s\t%s\t%s\t%s\n", r.Scope, r.Key, r.State, fmtListTime(r.CreatedAt),
			fmtListTime(r.ExpiresAt), idem.ScopeHash(r.Scope), strings.Join(note, ","))
	}
	return tw.Flush()
}

func fmtListTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

const listJSONHelp = `--json prints {"store", "records": [{"scope", "scope_hash", "key", "state",
"token", "fingerprint", "created_at", "lease_expires_at", "completed_at",
"expires_at", "failed", "tombstone"}], "next_cursor"} (times RFC 3339 in UTC,
omitted when unset; next_cursor empty at the end).`

func newKeysListCmd() *cobra.Command {
	var (
		cfg    *storeConfig
		sel    *keySelector
		limit  int
		cursor string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List stored records by key, key prefix, scope, scope prefix, scope hash, state and age",
		Long: `List the records of the store that match every filter given (none: all of
them), without their results ("idem keys get KEY --scope SCOPE" shows one).
Scopes and keys are quoted as Go strings. At most --limit records are printed
(0: all); when more match, the last line gives the --cursor that continues.
SQL stores list in (scope, key) order; Redis in no particular order.

To find what the proxy or the HTTP middleware stored for a request whose log
line shows scope_hash, use --scope-hash; for the key of a message or request,
"idem keys find KEY" searches every scope.

` + listJSONHelp,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if limit < 0 {
				return usageErrorf("--limit must not be negative, got %d", limit)
			}
			f, err := sel.filter(time.Now())
			if err != nil {
				return err
			}
			return withLister(cmd, cfg, func(_ idem.Store, l idem.Lister) error {
				recs, next, err := collect(cmd.Context(), l, f, limit, cursor)
				if errors.Is(err, idem.ErrInvalidConfig) && cursor != "" {
					return usageErrorf("--cursor %q: not a cursor this store gave for these filters", cursor)
				}
				if err != nil {
					return fmt.Errorf("keys list: %w", err)
				}
				out := cmd.OutOrStdout()
				if asJSON {
					return writeJSON(out, listJSON{Store: redactDSN(cfg.DSN), Records: toListedJSON(recs), Next: next})
				}
				if len(recs) == 0 && next == "" {
					fmt.Fprintln(out, "no records match")
					return nil
				}
				if err := writeListed(out, recs); err != nil {
					return err
				}
				if next != "" {
					fmt.Fprintf(out, "more records may match: add --cursor %s\n", shellQuote(next))
				}
				return nil
			})
		},
	}
	cfg = addStoreFlags(cmd)
	sel = addSelectorFlags(cmd, true)
	cmd.Flags().IntVar(&limit, "limit", 100, "print at most this many records (0: all)")
	cmd.Flags().StringVar(&cursor, "cursor", "", "continue a listing where the previous one stopped (its last line gives it)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the records as JSON")
	return cmd
}

func newKeysFindCmd() *cobra.Command {
	var (
		cfg    *storeConfig
		limit  int
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "find KEY",
		Short: "Find KEY in every scope (exit 1 when there is none)",
		Long: `Find the records of KEY in every scope: the scope a consumer, the Guard, the
HTTP middleware or the proxy stored it under is what "idem keys get" and
"idem keys delete" need. Exits 1 when no scope holds KEY. On a SQL store
this reads the whole table (in bounded pages); narrow it with "idem keys
list --key KEY --scope-prefix ..." if it is large.

` + listJSONHelp,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := idem.ValidateKey(args[0]); err != nil {
				return usageError{err}
			}
			if limit < 0 {
				return usageErrorf("--limit must not be negative, got %d", limit)
			}
			return withLister(cmd, cfg, func(_ idem.Store, l idem.Lister) error {
				recs, next, err := collect(cmd.Context(), l, idem.ListFilter{Key: args[0]}, limit, "")
				if err != nil {
					return fmt.Errorf("keys find: %w", err)
				}
				out := cmd.OutOrStdout()
				if asJSON {
					if err := writeJSON(out, listJSON{Store: redactDSN(cfg.DSN), Records: toListedJSON(recs), Next: next}); err != nil {
						return err
					}
				} else if len(recs) > 0 {
					if err := writeListed(out, recs); err != nil {
						return err
					}
					fmt.Fprintf(out, "read one with: idem keys get %s --scope SCOPE\n", shellQuote(args[0]))
					if next != "" {
						fmt.Fprintf(out, "more scopes hold it: idem keys list --key %s --cursor %s\n", shellQuote(args[0]), shellQuote(next))
					}
				}
				if len(recs) == 0 {
					return fmt.Errorf("key %q not found in any scope of %s", args[0], redactDSN(cfg.DSN))
				}
				return nil
			})
		},
	}
	cfg = addStoreFlags(cmd)
	cmd.Flags().IntVar(&limit, "limit", 100, "print at most this many records (0: all)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the records as JSON")
	return cmd
}

// deleteSelected deletes the records sel matches: with dryRun it lists
// them, without yes it refuses and says how many it would delete.
func deleteSelected(cmd *cobra.Command, cfg *storeConfig, sel *keySelector, dryRun, yes, asJSON bool) error {
	f, err := sel.filter(time.Now())
	if err != nil {
		return err
	}
	b, err := lookupBackend(cfg.DSN)
	if err != nil {
		return err
	}
	name := describeStore(b, *cfg)
	return withLister(cmd, cfg, func(s idem.Store, l idem.Lister) error {
		recs, _, err := collect(cmd.Context(), l, f, 0, "")
		if err != nil {
			return fmt.Errorf("keys delete: %w", err)
		}
		out := cmd.OutOrStdout()
		if len(recs) == 0 {
			return fmt.Errorf("no records of %s match; nothing deleted", name)
		}
		if dryRun {
			if asJSON {
				return writeJSON(out, listJSON{Store: redactDSN(cfg.DSN), Records: toListedJSON(recs)})
			}
			if err := writeListed(out, recs); err != nil {
				return err
			}
			fmt.Fprintf(out, "would delete %d record(s) from %s (dry run: nothing deleted)\n", len(recs), name)
			return nil
		}
		if !yes {
			return usageErrorf("keys delete would delete %d record(s) from %s, whatever their state; add --yes to do it (--dry-run lists them)", len(recs), name)
		}
		var deleted, gone int
		for _, r := range recs {
			err := s.Delete(cmd.Context(), r.Scope, r.Key)
			switch {
			case errors.Is(err, idem.ErrNotFound):
				gone++
			case err != nil:
				return fmt.Errorf("keys delete: after %d deleted: key %q in scope %q: %w", deleted, r.Key, r.Scope, err)
			default:
				deleted++
			}
		}
		fmt.Fprintf(out, "deleted %d record(s) from %s", deleted, name)
		if gone > 0 {
			fmt.Fprintf(out, " (%d more were gone already)", gone)
		}
		fmt.Fprintln(out)
		return nil
	})
}
