package main

import (
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/idem-go/idem"
	"github.com/spf13/cobra"
)

func init() { commands = append(commands, newKeysCmd) }

func newKeysCmd(a *app) *cobra.Command {
	return groupCmd("keys", "Inspect, delete and purge stored idempotency records",
		newKeysGetCmd(), newKeysDeleteCmd(), newKeysPurgeCmd())
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
	return fmt.Errorf("key %q not found in scope %q of %s", key, scope, redactDSN(cfg.DSN))
}

func newKeysGetCmd() *cobra.Command {
	var (
		cfg    *storeConfig
		scope  string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "get KEY",
		Short: "Show the record stored for KEY (exit 1 when there is none)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			key, err := keyArg(scope, args)
			if err != nil {
				return err
			}
			return withStore(cmd, cfg, func(s idem.Store) error {
				rec, err := s.Get(cmd.Context(), scope, key)
				if errors.Is(err, idem.ErrNotFound) {
					return notFound(cfg, scope, key)
				}
				if err != nil {
					return fmt.Errorf("keys get: %w", err)
				}
				if asJSON {
					return writeRecordJSON(cmd.OutOrStdout(), rec)
				}
				return writeRecord(cmd.OutOrStdout(), rec)
			})
		},
	}
	cfg = addStoreFlags(cmd)
	cmd.Flags().StringVar(&scope, "scope", "", "scope of the key (for consumers, the consumer name)")
	envFlag(cmd, "scope", "IDEM_SCOPE")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the record as JSON")
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

// writeRecord prints rec as aligned "field  value" lines.
func writeRecord(w io.Writer, rec idem.Record) error {
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
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\n", r[0], r[1])
	}
	return tw.Flush()
}

// recordJSON is the --json form of a record. Times are RFC 3339 in UTC and
// omitted when unset; Result is base64, as encoding/json writes bytes.
type recordJSON struct {
	Scope          string     `json:"scope"`
	Key            string     `json:"key"`
	State          idem.State `json:"state"`
	Token          int64      `json:"token"`
	Fingerprint    string     `json:"fingerprint"`
	CreatedAt      *time.Time `json:"created_at,omitempty"`
	LeaseExpiresAt *time.Time `json:"lease_expires_at,omitempty"`
	CompletedAt    *time.Time `json:"completed_at,omitempty"`
	ExpiresAt      *time.Time `json:"expires_at,omitempty"`
	ResultSize     int        `json:"result_size"`
	Result         []byte     `json:"result"`
	Failed         bool       `json:"failed"`
	Tombstone      bool       `json:"tombstone"`
}

func jsonTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

func writeRecordJSON(w io.Writer, rec idem.Record) error {
	return writeJSON(w, recordJSON{
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
	})
}

func newKeysDeleteCmd() *cobra.Command {
	var (
		cfg   *storeConfig
		scope string
	)
	cmd := &cobra.Command{
		Use:   "delete KEY",
		Short: "Delete the record for KEY whatever its state, so the operation can run again",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			key, err := keyArg(scope, args)
			if err != nil {
				return err
			}
			return withStore(cmd, cfg, func(s idem.Store) error {
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
	cmd.Flags().StringVar(&scope, "scope", "", "scope of the key (for consumers, the consumer name)")
	envFlag(cmd, "scope", "IDEM_SCOPE")
	return cmd
}

func newKeysPurgeCmd() *cobra.Command {
	var (
		cfg   *storeConfig
		batch int
	)
	cmd := &cobra.Command{
		Use:   "purge",
		Short: "Delete every record whose retention has passed, in short batches",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if batch < 0 {
				return usageErrorf("--batch must not be negative, got %d", batch)
			}
			return withStore(cmd, cfg, func(s idem.Store) error {
				n, err := s.Purge(cmd.Context(), batch)
				if err != nil {
					return fmt.Errorf("keys purge: %w", err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "purged %d expired records\n", n)
				return nil
			})
		},
	}
	cfg = addStoreFlags(cmd)
	cmd.Flags().IntVar(&batch, "batch", 0, "rows deleted per statement (0 = the store's default)")
	return cmd
}
