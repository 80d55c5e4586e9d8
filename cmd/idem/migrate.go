package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/idem-go/idem/shared/migration"
	"github.com/spf13/cobra"
)

func init() { commands = append(commands, newMigrateCmd) }

// addStoreFlags adds --store and --schema with their environment fallbacks
// and returns where their values land.
func addStoreFlags(cmd *cobra.Command) *storeConfig {
	cfg := &storeConfig{}
	cmd.Flags().StringVar(&cfg.DSN, "store", defaultStore, "store DSN, one of "+schemeExamples())
	envFlag(cmd, "store", "IDEM_STORE")
	cmd.Flags().StringVar(&cfg.Schema, "schema", "public", "PostgreSQL schema that holds the idem tables (ignored by other stores)")
	envFlag(cmd, "schema", "IDEM_SCHEMA")
	return cfg
}

func newMigrateCmd(a *app) *cobra.Command {
	return groupCmd("migrate", "Apply, revert, inspect or print the store's schema migrations",
		newMigrateUpCmd(), newMigrateDownCmd(), newMigrateStatusCmd(), newMigrateSQLCmd())
}

// exitPending is the exit code of "migrate status" when migrations are
// pending, so a deploy script can tell "not migrated" from "failed" (1).
const exitPending = 3

// migrateTarget is what a migrate command acts on: the backend, its
// description for messages, and whether it has a schema at all.
type migrateTarget struct {
	b    *backend
	name string
}

func lookupMigrateTarget(cfg storeConfig) (migrateTarget, error) {
	b, err := lookupBackend(cfg.DSN)
	if err != nil {
		return migrateTarget{}, err
	}
	return migrateTarget{b: b, name: describeStore(b, cfg)}, nil
}

// noSchema reports, and says on out, that the backend has no schema to
// migrate: not a failure, so that a deploy script may migrate every store.
func (t migrateTarget) noSchema(out io.Writer) bool {
	if t.b.Migrator != nil && t.b.Migrations != nil {
		return false
	}
	fmt.Fprintf(out, "%s: %s stores have no schema to migrate; nothing to do\n", t.name, t.b.Name)
	return true
}

func newMigrateUpCmd() *cobra.Command {
	var cfg *storeConfig
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Apply every pending migration (creates a SQLite file if needed)",
		Long: `Apply every pending migration. Concurrent runs (replicas starting together) are
safe. On a store without a schema (Redis) it says so and exits 0.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c := *cfg
			c.Create = true
			t, err := lookupMigrateTarget(c)
			if err != nil || t.noSchema(cmd.OutOrStdout()) {
				return err
			}
			m, closeFn, err := t.b.Migrator(cmd.Context(), c)
			if err != nil {
				return err
			}
			defer closeFn()
			res, err := m.Up(cmd.Context())
			if err != nil {
				return fmt.Errorf("migrate up: %w", err)
			}
			applied := res.Versions
			out := cmd.OutOrStdout()
			if len(applied) == 0 {
				fmt.Fprintf(out, "%s is up to date\n", t.name)
				return nil
			}
			fmt.Fprintf(out, "applied migrations %s to %s\n", joinInts(applied), t.name)
			return nil
		},
	}
	cfg = addStoreFlags(cmd)
	return cmd
}

func newMigrateDownCmd() *cobra.Command {
	var (
		cfg   *storeConfig
		steps int
		yes   bool
	)
	cmd := &cobra.Command{
		Use:   "down",
		Short: "Revert the newest migrations (default one); this drops stored data",
		Long: `Revert the newest --steps applied migrations. Reverting drops their tables and
everything stored in them (keys, inbox rows, dead messages), so it needs --yes;
without it, it names the store and the migrations it would revert and exits 2.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if steps <= 0 {
				return usageErrorf("--steps must be positive, got %d", steps)
			}
			t, err := lookupMigrateTarget(*cfg)
			if err != nil || t.noSchema(cmd.OutOrStdout()) {
				return err
			}
			m, closeFn, err := t.b.Migrator(cmd.Context(), *cfg)
			if err != nil {
				return err
			}
			defer closeFn()
			out := cmd.OutOrStdout()
			if !yes {
				st, err := m.Status(cmd.Context())
				if err != nil {
					return fmt.Errorf("migrate down: %w", err)
				}
				doomed := newestApplied(st, steps)
				if len(doomed) == 0 {
					fmt.Fprintf(out, "%s has no applied migrations\n", t.name)
					return nil
				}
				return usageErrorf("migrate down would revert %s in %s and drop what they store; add --yes to do it",
					strings.Join(doomed, ", "), t.name)
			}
			res, err := m.Down(cmd.Context(), steps)
			if err != nil {
				return fmt.Errorf("migrate down: %w", err)
			}
			reverted := res.Versions
			if len(reverted) == 0 {
				fmt.Fprintf(out, "%s has no applied migrations\n", t.name)
				return nil
			}
			fmt.Fprintf(out, "reverted migrations %s in %s\n", joinInts(reverted), t.name)
			return nil
		},
	}
	cfg = addStoreFlags(cmd)
	cmd.Flags().IntVar(&steps, "steps", 1, "how many migrations to revert")
	cmd.Flags().BoolVar(&yes, "yes", false, "confirm: drop the reverted migrations' tables and their data")
	return cmd
}

// newestApplied names the newest n applied migrations of st, newest first
// ("2 (create_inbox)").
func newestApplied(st []migration.Status, n int) []string {
	var out []string
	for i := len(st) - 1; i >= 0 && len(out) < n; i-- {
		if st[i].Applied {
			out = append(out, fmt.Sprintf("%d (%s)", st[i].Version, st[i].Name))
		}
	}
	return out
}

// migrationStatusJSON is one element of "migrate status --json".
type migrationStatusJSON struct {
	Version   int        `json:"version"`
	Name      string     `json:"name"`
	Applied   bool       `json:"applied"`
	AppliedAt *time.Time `json:"applied_at,omitempty"`
}

// migrateStatusJSON is the output of "migrate status --json".
type migrateStatusJSON struct {
	Store      string                `json:"store"`
	Pending    int                   `json:"pending"`
	Migrations []migrationStatusJSON `json:"migrations"`
}

func newMigrateStatusCmd() *cobra.Command {
	var (
		cfg    *storeConfig
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "status",
		Short: "List the migrations and whether each is applied (exit 3 when some are pending)",
		Long: `List the migrations and whether each is applied. Exit codes: 0 when the schema
is up to date (or the store has none), 3 when migrations are pending, 1 when
the store cannot be read. --json prints {"store", "pending", "migrations":
[{"version", "name", "applied", "applied_at"}]}.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			t, err := lookupMigrateTarget(*cfg)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if asJSON && (t.b.Migrator == nil || t.b.Migrations == nil) {
				return writeJSON(out, migrateStatusJSON{Store: t.name, Migrations: []migrationStatusJSON{}})
			}
			if t.noSchema(out) {
				return nil
			}
			m, closeFn, err := t.b.Migrator(cmd.Context(), *cfg)
			if err != nil {
				return err
			}
			defer closeFn()
			st, err := m.Status(cmd.Context())
			if err != nil {
				return fmt.Errorf("migrate status: %w", err)
			}
			pending := 0
			rows := make([]migrationStatusJSON, len(st))
			for i, s := range st {
				rows[i] = migrationStatusJSON{Version: s.Version, Name: s.Name, Applied: s.Applied}
				if s.Applied && !s.AppliedAt.IsZero() {
					at := s.AppliedAt.UTC()
					rows[i].AppliedAt = &at
				}
				if !s.Applied {
					pending++
				}
			}
			if asJSON {
				err = writeJSON(out, migrateStatusJSON{Store: t.name, Pending: pending, Migrations: rows})
			} else {
				err = printMigrationStatus(out, t.name, rows)
			}
			if err != nil {
				return err
			}
			if pending > 0 {
				if !asJSON {
					fmt.Fprintf(out, "%d pending; run: %s\n", pending, migrateUpCommand(*cfg))
				}
				return exitCodeError{exitPending, fmt.Errorf("%s: %d migrations pending", t.name, pending)}
			}
			return nil
		},
	}
	cfg = addStoreFlags(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON object, for scripts")
	return cmd
}

func printMigrationStatus(out io.Writer, store string, rows []migrationStatusJSON) error {
	fmt.Fprintln(out, store)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "VERSION\tNAME\tSTATUS\tAPPLIED AT")
	for _, r := range rows {
		state, at := "pending", "-"
		if r.Applied {
			state = "applied"
			if r.AppliedAt != nil {
				at = r.AppliedAt.Format(time.RFC3339)
			}
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", r.Version, r.Name, state, at)
	}
	return tw.Flush()
}

func newMigrateSQLCmd() *cobra.Command {
	var (
		cfg  *storeConfig
		down bool
	)
	cmd := &cobra.Command{
		Use:   "sql [VERSION]",
		Short: "Print the migrations' SQL for teams that apply schema changes with their own tools",
		Long: `Print the SQL of every migration (or of VERSION) in the order it must run.
With --down, print the reverting SQL, newest first. Nothing is executed and no
connection is made: --store only selects the backend. The statements use
unqualified names; for PostgreSQL run them with search_path set to your schema.`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			b, err := lookupBackend(cfg.DSN)
			if err != nil {
				return err
			}
			if b.Migrations == nil {
				return fmt.Errorf("%s stores have no schema to migrate", b.Name)
			}
			migs := b.Migrations()
			if len(args) == 1 {
				v, err := strconv.Atoi(args[0])
				if err != nil || v < 1 || v > len(migs) {
					return usageErrorf("VERSION must be a number from 1 to %d, got %q", len(migs), args[0])
				}
				migs = migs[v-1 : v]
			}
			if down {
				rev := make([]migration.Migration, len(migs))
				for i, m := range migs {
					rev[len(migs)-1-i] = m
				}
				migs = rev
			}
			out := cmd.OutOrStdout()
			for i, m := range migs {
				dir, body := "up", m.Up
				if down {
					dir, body = "down", m.Down
				}
				if i > 0 {
					fmt.Fprintln(out)
				}
				fmt.Fprintf(out, "-- %s migration %d (%s) %s\n%s", b.Name, m.Version, m.Name, dir, body)
				if !strings.HasSuffix(body, "\n") {
					fmt.Fprintln(out)
				}
			}
			return nil
		},
	}
	cfg = addStoreFlags(cmd)
	cmd.Flags().BoolVar(&down, "down", false, "print the reverting SQL instead")
	return cmd
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ", ")
}
