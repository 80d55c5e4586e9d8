package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idempgx"
	"github.com/spf13/cobra"
)

func newKeysMaintainCmd() *cobra.Command {
	var (
		cfg         *storeConfig
		partition   bool
		interval    time.Duration
		rotate      bool
		lockTimeout time.Duration
	)
	cmd := &cobra.Command{
		Use:   "maintain",
		Short: "Rotate and drop the partitions of a partitioned PostgreSQL store (retention at scale)",
		Long: `Do the housekeeping of a PostgreSQL schema in the partitioned layout: move the
writes to a new partition once the current one took them for its interval
(the next partition is created first), and drop every older partition whose
records all expired: retention by dropping whole tables, which gives their
space back at once, instead of deleting rows. Run it every few minutes (from
cron, or a sidecar); it is cheap when there is nothing to do, and safe from
several processes at once.

--partition first converts a schema of the plain layout (the existing table
becomes partition 0, dropped once its records expired; new records go to
partition 1, one partition per --interval). Stop the processes that use the
schema with an older idem first. It rebuilds the primary key of the existing
rows under a lock: convert an empty or small table.

Other stores have no partitions: SQLite and MySQL retire records with
'idem keys purge', and Redis expires them itself.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if lockTimeout < 0 {
				return usageErrorf("--lock-timeout must not be negative, got %v", lockTimeout)
			}
			if interval < time.Second {
				return usageErrorf("--interval must be at least 1s, got %v", interval)
			}
			b, err := lookupBackend(cfg.DSN)
			if err != nil {
				return err
			}
			return withStore(cmd, cfg, func(s idem.Store) error {
				ps, ok := s.(*idempgx.Store)
				if !ok {
					return usageErrorf("keys maintain: %s stores have no partitions; use 'idem keys purge'", b.Name)
				}
				ctx, out := cmd.Context(), cmd.OutOrStdout()
				if partition && !ps.Config().Partitioned {
					m, err := idempgx.NewMigrator(ps.Pool(), &idempgx.MigratorConfig{Schema: cfg.Schema})
					if err != nil {
						return err
					}
					if err := m.Partition(ctx, &idempgx.PartitionOptions{Interval: interval}); err != nil {
						return fmt.Errorf("keys maintain: %w", err)
					}
					c := ps.Config()
					c.Partitioned = true
					if ps, err = idempgx.New(ps.Pool(), &c); err != nil {
						return err
					}
					fmt.Fprintf(out, "converted %s to the partitioned layout (one partition per %v)\n", describeStore(b, *cfg), interval)
				}
				if !ps.Config().Partitioned {
					return usageErrorf("keys maintain: %s has the plain table; convert it with --partition (or use 'idem keys purge')", describeStore(b, *cfg))
				}
				rep, err := ps.Maintain(ctx, &idempgx.MaintainOptions{Rotate: rotate, LockTimeout: lockTimeout})
				if err != nil {
					return fmt.Errorf("keys maintain: %w", err)
				}
				writeMaintainReport(out, rep)
				return nil
			})
		},
	}
	cfg = addStoreFlags(cmd)
	cmd.Flags().BoolVar(&partition, "partition", false, "first convert a plain schema to the partitioned layout")
	cmd.Flags().DurationVar(&interval, "interval", 24*time.Hour, "with --partition: how long one partition takes the writes")
	cmd.Flags().BoolVar(&rotate, "rotate", false, "move the writes to a new partition now, even if the current one is younger than its interval")
	cmd.Flags().DurationVar(&lockTimeout, "lock-timeout", 0, "bound on each lock wait (0 = the store's default, 2s); a timed-out step is left for the next run")
	return cmd
}

func writeMaintainReport(out interface{ Write([]byte) (int, error) }, rep idempgx.MaintainReport) {
	rotated := "not rotated"
	if rep.Rotated {
		rotated = "rotated"
	}
	fmt.Fprintf(out, "current partition idem_records_p%d (%s)\n", rep.Current, rotated)
	fmt.Fprintf(out, "dropped %d: %s\n", len(rep.Dropped), orNone(rep.Dropped))
	fmt.Fprintf(out, "kept %d (live records or busy): %s\n", len(rep.Kept), orNone(rep.Kept))
}

func orNone(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}
