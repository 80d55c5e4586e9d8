// Command idem is the idem command-line tool: the demo, schema migrations,
// inspection of stored keys, the Idempotency-Key proxy, the retry-storm
// simulator, the inbox and dead-letter tools.
//
// # Configuration
//
// The store is chosen by --store or IDEM_STORE (default sqlite://idem.db):
// sqlite://PATH for the embedded store, postgres:// or postgresql:// for
// PostgreSQL, mysql://USER[:PASSWORD]@HOST[:PORT]/DB (or mariadb://) for
// MySQL and MariaDB, redis:// for Redis. The PostgreSQL schema holding the
// idem tables is a separate flag, --schema or IDEM_SCHEMA (default public), rather than a search_path
// in the DSN, so that the same DSN works for the application and the CLI and
// the hints the CLI prints ("run: idem migrate up …") name it explicitly.
// Exit status: 0 success, 1 the command failed, 2 the command line was
// wrong, 3 a check found something to alert on (dlq list --fail-if-any). Errors are one line on stderr, never a stack trace or usage dump.
//
// # Adding a subcommand
//
// Create one file, say foo.go, with a constructor and register it in init:
//
//	func init() { commands = append(commands, newFooCmd) }
//
//	func newFooCmd(a *app) *cobra.Command { … }
//
// Use RunE (never Run or os.Exit): a returned error is printed as one line
// "idem: …" on stderr and the process exits 1; errors cobra raises before
// RunE runs (unknown flags, wrong argument counts) and errors wrapped with
// usageErrorf exit 2. Give every flag an IDEM_* environment fallback with
// envFlag; a flag on the command line wins over the environment, which wins
// over the default. Commands write to cmd.OutOrStdout() and
// cmd.ErrOrStderr() so tests can capture them.
//
// # Adding a store scheme
//
// Create one file, say store_foo.go, that registers the scheme's opener:
//
//	func init() {
//		registerBackend(backend{Name: "Foo", Schemes: []string{"foo"}, Open: openFoo})
//	}
//
// Open receives what the user chose (the DSN from --store / IDEM_STORE, the
// schema) and returns an idem.Store and a cleanup function. Set Migrator and
// Migrations too when the backend has a schema to migrate. Errors should
// already say what to do: the CLI prints them as one "idem: …" line, with
// the package prefixes of the layers they passed through taken out (report
// and oneLine in root.go).
package main

import (
	"context"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1 // the command ran and failed
	exitUsage   = 2 // the command line was wrong
)

// run executes the idem command line args and returns the exit code. It is
// main without the process: tests call it in-process.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return runEnv(ctx, args, stdout, stderr, os.Getenv)
}

// runEnv is run with the environment read through getenv, so tests can set
// IDEM_* variables without touching the process environment.
func runEnv(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) int {
	a := &app{stdout: stdout, stderr: stderr, getenv: getenv}
	root := a.rootCmd()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return exitOK
	}
	return a.report(cmd, err)
}
