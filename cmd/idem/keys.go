package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/spf13/cobra"
)

func init() { commands = append(commands, newKeysCmd) }

func newKeysCmd(a *app) *cobra.Command {
	return groupCmd("keys", "List, find, inspect, delete and purge stored idempotency records",
		newKeysListCmd(), newKeysFindCmd(), newKeysGetCmd(), newKeysDeleteCmd(), newKeysPurgeCmd(), newKeysMaintainCmd())
}

// withStore opens the store cfg names, runs fn and closes the store.
func withStore(cmd *cobra.Command, cfg *storeConfig, fn func(idem.Store) error) error {
	store, closeFn, err := openStore(cmd.Context(), *cfg)
	if err != nil {
		return err
	}
	err = fn(store)
	if cerr := closeFn(); err == nil && cerr != nil {
		err = fmt.Errorf("close store: %w", cerr)
	}
	return err
}

// keyArg checks the KEY argument and --scope before any store is opened.
func keyArg(scope string, args []string) (string, error) {
	if err := idem.Validate(scope, args[0]); err != nil {
		return "", usageError{err}
	}
	return args[0], nil
}

func notFound(cfg *storeConfig, scope, key string) error {
	return fmt.Errorf("key %q not found in scope %q of %s; idem keys find %s searches every scope",
		key, scope, redactDSN(cfg.DSN), shellQuote(key))
}

func newKeysGetCmd() *cobra.Command {
	var (
		cfg         *storeConfig
		scope       string
		asJSON      bool
		resultBytes int
	)
	cmd := &cobra.Command{
		Use:   "get KEY",
		Short: "Show the record stored for KEY, its result decoded (exit 1 when there is none)",
		Long: `Show the record stored for KEY in --scope, and its result: for a key of the
HTTP middleware or proxy (scope "http ..."), the stored response a retry is
replayed (status, replayed headers, body) and the scope's parts (principal,
method, route, and the scope hash the logs print); otherwise the Guard's or
handler's result, as text when it is UTF-8, else as a hex dump. At most
--result-bytes of a body or result are printed (0: all).

--json prints {"scope", "key", "state", "token", "fingerprint", "created_at",
"lease_expires_at", "completed_at", "expires_at", "result_size", "result"
(base64), "result_text" (when UTF-8), "failed", "tombstone", "http_scope":
{"principal", "method", "route", "hash"}, "http_response": {"status",
"headers", "body" (text) or "body_base64", "discarded"}, "steps": [{"seq",
"name", "token", "created_at", "expires_at", "result" (base64), "result_text",
"tombstone"}]}.

An operation run with recovery points (idem.StepsOf, idem.DoTx) shows its
recorded steps after the record: a retry resumes after the last of them. A
released operation (no record) whose steps are kept shows state "released"
and its steps.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			key, err := keyArg(scope, args)
			if err != nil {
				return err
			}
			return withStore(cmd, cfg, func(s idem.Store) error {
				rec, err := s.Get(cmd.Context(), scope, key)
				if err != nil && !errors.Is(err, idem.ErrNotFound) {
					return fmt.Errorf("keys get: %w", err)
				}
				steps, serr := recordedSteps(cmd.Context(), s, scope, key)
				if serr != nil {
					return fmt.Errorf("keys get: steps: %w", serr)
				}
				if err != nil {
					// A released operation keeps its recorded steps (a
					// retry resumes after them): show those.
					if len(steps) == 0 {
						return notFound(cfg, scope, key)
					}
					rec = idem.Record{Scope: scope, Key: key, State: "released"}
				}
				if asJSON {
					return writeRecordJSON(cmd.OutOrStdout(), rec, steps)
				}
				if err := writeRecord(cmd.OutOrStdout(), rec, resultBytes); err != nil {
					return err
				}
				return writeSteps(cmd.OutOrStdout(), steps, resultBytes)
			})
		},
	}
	cfg = addStoreFlags(cmd)
	cmd.Flags().StringVar(&scope, "scope", "", "scope of the key (for consumers, the consumer name)")
	envFlag(cmd, "scope", "IDEM_SCOPE")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the record as JSON")
	cmd.Flags().IntVar(&resultBytes, "result-bytes", 4096, "print at most this many bytes of a result or body (0: all)")
	return cmd
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339Nano)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// writeRecord prints rec as aligned "field  value" lines, then its
// result decoded, at most max bytes of it (0: all).
func writeRecord(w io.Writer, rec idem.Record, max int) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	result := fmt.Sprintf("%d bytes", len(rec.Result))
	if rec.Tombstone {
		result = "discarded (larger than the store's limit)"
	}
	rows := [][2]string{
		{"scope", fmt.Sprintf("%q", rec.Scope)},
		{"key", fmt.Sprintf("%q", rec.Key)},
		{"state", string(rec.State)},
		{"token", fmt.Sprint(rec.Token)},
		{"fingerprint", rec.Fingerprint.String()},
		{"created", fmtTime(rec.CreatedAt)},
		{"lease expires", fmtTime(rec.LeaseExpiresAt)},
		{"completed", fmtTime(rec.CompletedAt)},
		{"expires", fmtTime(rec.ExpiresAt)},
		{"result", result},
		{"failed", yesNo(rec.Failed)},
		{"tombstone", yesNo(rec.Tombstone)},
	}
	if p, m, r, ok := idemhttp.ParseScope(rec.Scope); ok {
		rows = append(rows, [2]string{"http principal", fmt.Sprintf("%q", p)}, [2]string{"http method", m},
			[2]string{"http route", r})
	}
	if strings.HasPrefix(rec.Scope, "http ") {
		rows = append(rows, [2]string{"scope hash", idem.ScopeHash(rec.Scope) + " (as in the proxy's log)"})
	}
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\n", r[0], r[1])
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(rec.Result) == 0 {
		return nil
	}
	resp, err := storedHTTP(rec)
	if err != nil {
		printBytes(w, "result", "--result-bytes", rec.Result, max)
		return nil
	}
	fmt.Fprintf(w, "\nstored HTTP response (replayed to a retry):\n%d %s\n", resp.Status, http.StatusText(resp.Status))
	if resp.Discarded {
		fmt.Fprintln(w, "(the response was larger than the capture limit: only its completion was kept; a retry gets 410)")
	}
	keys := make([]string, 0, len(resp.Header))
	for k := range resp.Header {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		for _, v := range resp.Header[k] {
			fmt.Fprintf(w, "%s: %s\n", k, v)
		}
	}
	printBytes(w, "body", "--result-bytes", resp.Body, max)
	return nil
}

// storedHTTP decodes rec's result as a response the HTTP middleware or
// proxy stored; an error for any other record.
func storedHTTP(rec idem.Record) (*idemhttp.StoredResponse, error) {
	if !strings.HasPrefix(rec.Scope, "http ") || rec.Failed {
		return nil, errors.New("not an HTTP record")
	}
	return idemhttp.DecodeStoredResponse(rec.Result)
}

// recordJSON is the --json form of a record. Times are RFC 3339 in UTC and
// omitted when unset; Result is base64, as encoding/json writes bytes.
type recordJSON struct {
	Scope          string            `json:"scope"`
	Key            string            `json:"key"`
	State          idem.State        `json:"state"`
	Token          int64             `json:"token"`
	Fingerprint    string            `json:"fingerprint"`
	CreatedAt      *time.Time        `json:"created_at,omitempty"`
	LeaseExpiresAt *time.Time        `json:"lease_expires_at,omitempty"`
	CompletedAt    *time.Time        `json:"completed_at,omitempty"`
	ExpiresAt      *time.Time        `json:"expires_at,omitempty"`
	ResultSize     int               `json:"result_size"`
	Result         []byte            `json:"result"`
	ResultText     *string           `json:"result_text,omitempty"`
	Failed         bool              `json:"failed"`
	Tombstone      bool              `json:"tombstone"`
	HTTPScope      *httpScopeJSON    `json:"http_scope,omitempty"`
	HTTPResponse   *httpResponseJSON `json:"http_response,omitempty"`
	Steps          []stepJSON        `json:"steps,omitempty"`
}

// httpScopeJSON is the parts of an HTTP middleware's scope in "keys get
// --json", with the hash the proxy's log prints.
type httpScopeJSON struct {
	Principal string `json:"principal"`
	Method    string `json:"method"`
	Route     string `json:"route"`
	Hash      string `json:"hash"`
}

// httpResponseJSON is a stored HTTP response in "keys get --json".
type httpResponseJSON struct {
	Status     int         `json:"status"`
	Headers    http.Header `json:"headers"`
	Body       *string     `json:"body,omitempty"`
	BodyBase64 []byte      `json:"body_base64,omitempty"`
	Discarded  bool        `json:"discarded,omitempty"`
}

// textOrNil is b as a string when it is valid UTF-8 (and not empty).
func textOrNil(b []byte) *string {
	if len(b) == 0 || !utf8.Valid(b) {
		return nil
	}
	s := string(b)
	return &s
}

func jsonTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

// recordedSteps returns the live recovery points of (scope, key) when the
// store keeps them (idem.StepStore), else none.
func recordedSteps(ctx context.Context, s idem.Store, scope, key string) ([]idem.StepRecord, error) {
	ss, ok := s.(idem.StepStore)
	if !ok {
		return nil, nil
	}
	return ss.Steps(ctx, scope, key)
}

// writeSteps prints an operation's recorded steps, each result as text
// when it is printable UTF-8 (at most max bytes, 0: all), else its size.
func writeSteps(w io.Writer, steps []idem.StepRecord, max int) error {
	if len(steps) == 0 {
		return nil
	}
	fmt.Fprintln(w, "\nsteps (recovery points; a retry resumes after the last):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  seq\tname\ttoken\trecorded\tresult")
	for _, st := range steps {
		result := fmt.Sprintf("%d bytes", len(st.Result))
		if st.Tombstone {
			result = "discarded (larger than the step limit)"
		} else if t := textOrNil(st.Result); t != nil {
			text := *t
			if max > 0 && len(text) > max {
				text = strings.ToValidUTF8(text[:max], "") + "…"
			}
			result += fmt.Sprintf("  %q", text)
		}
		fmt.Fprintf(tw, "  %d\t%s\t%d\t%s\t%s\n", st.Seq, st.Name, st.Token, fmtTime(st.CreatedAt), result)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "steps expire %s\n", fmtTime(steps[len(steps)-1].ExpiresAt))
	return err
}

// stepJSON is one recorded step in "keys get --json".
type stepJSON struct {
	Seq        int        `json:"seq"`
	Name       string     `json:"name"`
	Token      int64      `json:"token"`
	CreatedAt  *time.Time `json:"created_at,omitempty"`
	ExpiresAt  *time.Time `json:"expires_at,omitempty"`
	Result     []byte     `json:"result"`
	ResultText *string    `json:"result_text,omitempty"`
	Tombstone  bool       `json:"tombstone"`
}

func writeRecordJSON(w io.Writer, rec idem.Record, steps []idem.StepRecord) error {
	j := recordJSON{
		Scope:          rec.Scope,
		Key:            rec.Key,
		State:          rec.State,
		Token:          rec.Token,
		Fingerprint:    rec.Fingerprint.String(),
		CreatedAt:      jsonTime(rec.CreatedAt),
		LeaseExpiresAt: jsonTime(rec.LeaseExpiresAt),
		CompletedAt:    jsonTime(rec.CompletedAt),
		ExpiresAt:      jsonTime(rec.ExpiresAt),
		ResultSize:     len(rec.Result),
		Result:         rec.Result,
		Failed:         rec.Failed,
		Tombstone:      rec.Tombstone,
	}
	if p, m, r, ok := idemhttp.ParseScope(rec.Scope); ok {
		j.HTTPScope = &httpScopeJSON{p, m, r, idem.ScopeHash(rec.Scope)}
	}
	if resp, err := storedHTTP(rec); err == nil {
		h := resp.Header
		if h == nil {
			h = http.Header{}
		}
		j.HTTPResponse = &httpResponseJSON{Status: resp.Status, Headers: h, Discarded: resp.Discarded, Body: textOrNil(resp.Body)}
		if j.HTTPResponse.Body == nil && len(resp.Body) > 0 {
			j.HTTPResponse.BodyBase64 = resp.Body
		}
	} else {
		j.ResultText = textOrNil(rec.Result)
	}
	for _, st := range steps {
		j.Steps = append(j.Steps, stepJSON{Seq: st.Seq, Name: st.Name, Token: st.Token, CreatedAt: jsonTime(st.CreatedAt),
			ExpiresAt: jsonTime(st.ExpiresAt), Result: st.Result, ResultText: textOrNil(st.Result), Tombstone: st.Tombstone})
	}
	return writeJSON(w, j)
}

func newKeysDeleteCmd() *cobra.Command {
	var (
		cfg                 *storeConfig
		sel                 *keySelector
		scope               string
		dryRun, yes, asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "delete [KEY] [--scope SCOPE | selectors --yes]",
		Short: "Delete the record of KEY, or every record the selectors match (--yes), whatever their state",
		Long: `Delete records whatever their state, so that their operations can run again
(a holder of a lease deleted under it gets ErrLeaseLost).

With KEY: delete the record of KEY in --scope (exit 1 when there is none).

Without KEY: delete every record that matches the selectors (--scope,
--key, --key-prefix, --scope-prefix, --scope-hash, --state, --older-than,
--newer-than; at least one, every one given must match). This needs --yes;
without it, it names the store, says how many records it would delete and
exits 2. --dry-run lists them (as keys list does) and deletes nothing. Exits
1 when no record matches.

` + "--json (with --dry-run) prints what keys list --json prints.",
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				// A scope from IDEM_SCOPE narrows the selection but does not
				// select on its own: a whole scope is deleted only when named.
				sel.scope = ""
				if !sel.any() && !cmd.Flags().Changed("scope") {
					return usageErrorf("give KEY, or selectors (--scope, --key, --key-prefix, --scope-prefix, --scope-hash, --state, --older-than, --newer-than) of the records to delete")
				}
				if asJSON && !dryRun {
					return usageErrorf("--json goes with --dry-run")
				}
				sel.scope = scope
				return deleteSelected(cmd, cfg, sel, dryRun, yes, asJSON)
			}
			if sel.any() || asJSON {
				return usageErrorf("KEY deletes one record of --scope; the selectors and --json are for deleting without KEY")
			}
			key, err := keyArg(scope, args)
			if err != nil {
				return err
			}
			return withStore(cmd, cfg, func(s idem.Store) error {
				if dryRun {
					_, err := s.Get(cmd.Context(), scope, key)
					if errors.Is(err, idem.ErrNotFound) {
						return notFound(cfg, scope, key)
					}
					if err != nil {
						return fmt.Errorf("keys delete: %w", err)
					}
					fmt.Fprintf(cmd.OutOrStdout(), "would delete key %q in scope %q (dry run: nothing deleted)\n", key, scope)
					return nil
				}
				err := s.Delete(cmd.Context(), scope, key)
				if errors.Is(err, idem.ErrNotFound) {
					return notFound(cfg, scope, key)
				}
				if err != nil {
					return fmt.Errorf("keys delete: %w", err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "deleted key %q in scope %q\n", key, scope)
				return nil
			})
		},
	}
	cfg = addStoreFlags(cmd)
	cmd.Flags().StringVar(&scope, "scope", "", "scope of KEY (for consumers, the consumer name); without KEY, delete this scope's records")
	envFlag(cmd, "scope", "IDEM_SCOPE")
	sel = addSelectorFlags(cmd, false)
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "list what would be deleted and delete nothing")
	cmd.Flags().BoolVar(&yes, "yes", false, "confirm deleting the records the selectors match")
	cmd.Flags().BoolVar(&asJSON, "json", false, "with --dry-run, print the records as JSON")
	return cmd
}

func newKeysPurgeCmd() *cobra.Command {
	var (
		cfg    *storeConfig
		batch  int
		vacuum bool
	)
	cmd := &cobra.Command{
		Use:   "purge",
		Short: "Delete every record whose retention has passed, in short batches",
		Long: `Delete every record whose retention has passed, in short batches, and say how
many. The space they took is reused by new records but not given back to the
file system: --vacuum then reclaims it (SQLite: VACUUM, which rewrites the file,
needs as much free disk as the database and blocks writers while it runs;
PostgreSQL: VACUUM (ANALYZE) on the idem tables) and reports the sizes before and
after. Redis deletes expired records itself; there is nothing to purge.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if batch < 0 {
				return usageErrorf("--batch must not be negative, got %d", batch)
			}
			b, err := lookupBackend(cfg.DSN)
			if err != nil {
				return err
			}
			if vacuum && b.Vacuum == nil {
				return usageErrorf("--vacuum: %s stores have no space to reclaim this way", b.Name)
			}
			return withStore(cmd, cfg, func(s idem.Store) error {
				out := cmd.OutOrStdout()
				if b.ExpiresItself {
					fmt.Fprintf(out, "%s deletes expired records itself (each has a TTL); nothing to purge\n", b.Name)
					return nil
				}
				n, err := s.Purge(cmd.Context(), batch)
				if err != nil {
					return fmt.Errorf("keys purge: %w", err)
				}
				fmt.Fprintf(out, "purged %d expired records from %s\n", n, describeStore(b, *cfg))
				if !vacuum {
					return nil
				}
				msg, err := b.Vacuum(cmd.Context(), s, *cfg)
				if err != nil {
					return fmt.Errorf("keys purge: %w", err)
				}
				fmt.Fprintln(out, msg)
				return nil
			})
		},
	}
	cfg = addStoreFlags(cmd)
	cmd.Flags().IntVar(&batch, "batch", 0, "rows deleted per statement (0 = the store's default)")
	cmd.Flags().BoolVar(&vacuum, "vacuum", false, "then give the space back (SQLite VACUUM, PostgreSQL VACUUM (ANALYZE)) and report it")
	return cmd
}
