package main

import (
	"fmt"
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
	cmd.Flags().StringVar(&cfg.DSN, "store", defaultStore, "store DSN: sqlite://PATH or postgres://USER@HOST:PORT/DB")
	envFlag(cmd, "store", "IDEM_STORE")
	cmd.Flags().StringVar(&cfg.Schema, "schema", "public", "PostgreSQL schema that holds the idem tables (ignored by other stores)")
	envFlag(cmd, "schema", "IDEM_SCHEMA")
	return cfg
}

func newMigrateCmd(a *app) *cobra.Command {
	return groupCmd("migrate", "Apply, revert, inspect or print the store's schema migrations",
		newMigrateUpCmd(), newMigrateDownCmd(), newMigrateStatusCmd(), newMigrateSQLCmd())
}

func newMigrateUpCmd() *cobra.Command {
	var cfg *storeConfig
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Apply every pending migration (creates a SQLite file if needed)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c := *cfg
			c.Create = true
			m, closeFn, err := openMigrator(cmd.Context(), c)
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
				fmt.Fprintf(out, "%s is up to date\n", redactDSN(c.DSN))
				return nil
			}
			fmt.Fprintf(out, "applied migrations %s to %s\n", joinInts(applied), redactDSN(c.DSN))
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
	)
	cmd := &cobra.Command{
		Use:   "down",
		Short: "Revert the newest migrations (default one); this drops stored keys",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if steps <= 0 {
				return usageErrorf("--steps must be positive, got %d", steps)
			}
			m, closeFn, err := openMigrator(cmd.Context(), *cfg)
			if err != nil {
				return err
			}
			defer closeFn()
			res, err := m.Down(cmd.Context(), steps)
			if err != nil {
				return fmt.Errorf("migrate down: %w", err)
			}
			reverted := res.Versions
			out := cmd.OutOrStdout()
			if len(reverted) == 0 {
				fmt.Fprintf(out, "%s has no applied migrations\n", redactDSN(cfg.DSN))
				return nil
			}
			fmt.Fprintf(out, "reverted migrations %s in %s\n", joinInts(reverted), redactDSN(cfg.DSN))
			return nil
		},
	}
	cfg = addStoreFlags(cmd)
	cmd.Flags().IntVar(&steps, "steps", 1, "how many migrations to revert")
	return cmd
}

func newMigrateStatusCmd() *cobra.Command {
	var cfg *storeConfig
	cmd := &cobra.Command{
		Use:   "status",
		Short: "List the migrations and whether each is applied",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			m, closeFn, err := openMigrator(cmd.Context(), *cfg)
			if err != nil {
				return err
			}
			defer closeFn()
			st, err := m.Status(cmd.Context())
			if err != nil {
				return fmt.Errorf("migrate status: %w", err)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "VERSION\tNAME\tSTATUS\tAPPLIED AT")
			pending := 0
			for _, s := range st {
				state, at := "pending", "-"
				if s.Applied {
					state = "applied"
					if !s.AppliedAt.IsZero() {
						at = s.AppliedAt.UTC().Format(time.RFC3339)
					}
				} else {
					pending++
				}
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", s.Version, s.Name, state, at)
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if pending > 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "%d pending; run: %s\n", pending, migrateUpCommand(*cfg))
			}
			return nil
		},
	}
	cfg = addStoreFlags(cmd)
	return cmd
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
