package main

import (
	"errors"

	"github.com/idem-go/idem/cmd/idem/internal/demo"
	"github.com/spf13/cobra"
)

func init() { commands = append(commands, newDemoCmd) }

func newDemoCmd(a *app) *cobra.Command {
	o := demo.Defaults
	cmd := &cobra.Command{
		Use:   "demo",
		Short: demo.Short,
		Long:  demo.Long,
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			err := demo.Run(cmd.Context(), cmd.OutOrStdout(), o)
			if ue := (*demo.UsageError)(nil); errors.As(err, &ue) {
				return usageError{err}
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Store, "store", o.Store, "SQLite store for the ledger, sqlite://PATH (default: a temporary file)")
	f.Uint64Var(&o.Seed, "seed", o.Seed, "seed of the delivery order and amounts")
	envFlag(cmd, "seed", "IDEM_DEMO_SEED")
	f.IntVar(&o.Messages, "messages", o.Messages, "number of distinct payment messages")
	envFlag(cmd, "messages", "IDEM_DEMO_MESSAGES")
	f.IntVar(&o.Workers, "workers", o.Workers, "goroutines of the concurrent idem run (0 skips it)")
	envFlag(cmd, "workers", "IDEM_DEMO_WORKERS")
	f.IntVar(&o.Requests, "requests", o.Requests, "parallel retries of one payment through the HTTP middleware (0 skips it)")
	envFlag(cmd, "requests", "IDEM_DEMO_REQUESTS")
	return cmd
}
