package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// commands holds the constructors of the top-level subcommands; each
// subcommand's file appends its own in init.
var commands []func(a *app) *cobra.Command

// app is the state one run of the command line shares between commands.
type app struct {
	stdout, stderr io.Writer
	// getenv reads the environment (os.Getenv outside tests).
	getenv func(string) string
	// ran is set once a command's RunE starts: an error before that point
	// came from cobra's parsing and is a usage error.
	ran bool
}

func (a *app) rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "idem",
		Short: "Exactly-once effects over at-least-once delivery",
		Long: `idem makes duplicate deliveries harmless: a dedupe record committed with the
effect, idempotency keys for HTTP, leases with fencing tokens.

Start with "idem demo": a payments ledger fed duplicate deliveries, no server needed.`,
		SilenceUsage:  true,
		SilenceErrors: true,
		// "idem --version" prints what "idem version" does.
		Version: versionLine(),
		// A bare "idem" shows the help; "idem bogus" is a usage error.
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	root.CompletionOptions.HiddenDefaultCmd = true
	root.SetVersionTemplate("{{.Version}}\n")
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error { return usageError{flagError(cmd, err)} })
	for _, newCmd := range commands {
		root.AddCommand(newCmd(a))
	}
	a.wrap(root)
	return root
}

// wrap instruments every command's RunE so that it records that the command
// line was accepted and applies environment fallbacks first. Every flag that
// has no environment fallback of its own gets [autoEnv]'s.
func (a *app) wrap(c *cobra.Command) {
	c.LocalFlags().VisitAll(func(f *pflag.Flag) {
		if len(f.Annotations[envAnnotation]) == 0 && !noEnv[f.Name] {
			envFlag(c, f.Name, autoEnv(c, f.Name))
		}
	})
	if run := c.RunE; run != nil {
		c.RunE = func(cmd *cobra.Command, args []string) error {
			a.ran = true
			if err := a.applyEnv(cmd); err != nil {
				return err
			}
			return run(cmd, args)
		}
	}
	for _, sub := range c.Commands() {
		a.wrap(sub)
	}
}

// groupCmd returns a command that only holds subcommands: run without one,
// or with an unknown one, it is a usage error rather than a silent help page.
func groupCmd(use, short string, subs ...*cobra.Command) *cobra.Command {
	c := &cobra.Command{
		Use:   use,
		Short: short,
		RunE: func(cmd *cobra.Command, args []string) error {
			var names []string
			for _, sub := range cmd.Commands() {
				if sub.IsAvailableCommand() {
					names = append(names, sub.Name())
				}
			}
			if len(args) == 0 {
				return usageErrorf("missing subcommand, want one of: %s", strings.Join(names, ", "))
			}
			return usageErrorf("unknown command %q for %q, want one of: %s", args[0], cmd.CommandPath(), strings.Join(names, ", "))
		},
	}
	c.AddCommand(subs...)
	return c
}

// noEnv names the flags that have no environment fallback: help and
// version, and the confirmations of destructive commands, which must be
// typed for each run (an IDEM_…_YES left in a shell would confirm them all).
var noEnv = map[string]bool{"help": true, "version": true, "yes": true, "i-own-this-target": true}

// autoEnv is the environment fallback of a flag that names none of its own:
// IDEM_, the command's path after "idem", then the flag, upper-cased with
// "_" for spaces and dashes ("idem backoff --clients" → IDEM_BACKOFF_CLIENTS,
// "idem dlq amqp list --limit" → IDEM_DLQ_AMQP_LIST_LIMIT).
func autoEnv(c *cobra.Command, flag string) string {
	path := strings.Fields(c.CommandPath())[1:]
	name := strings.Join(append(path, flag), "_")
	return "IDEM_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// envAnnotation is the flag annotation that names its environment fallback.
const envAnnotation = "idem_env"

// envFlag gives flag name of cmd the environment fallback env: used when the
// flag is not on the command line. The help text mentions it.
func envFlag(cmd *cobra.Command, name, env string) {
	f := cmd.Flags().Lookup(name)
	if f == nil {
		panic("idem: envFlag: no flag " + name)
	}
	f.Usage += fmt.Sprintf(" (env %s)", env)
	if f.Annotations == nil {
		f.Annotations = map[string][]string{}
	}
	f.Annotations[envAnnotation] = []string{env}
}

// applyEnv sets every flag that was not given on the command line from its
// environment variable, when that is set and not empty.
func (a *app) applyEnv(cmd *cobra.Command) error {
	var err error
	visit := func(f *pflag.Flag) {
		env := f.Annotations[envAnnotation]
		if err != nil || f.Changed || len(env) == 0 {
			return
		}
		v := a.getenv(env[0])
		if v == "" {
			return
		}
		if e := f.Value.Set(v); e != nil {
			err = usageErrorf("invalid value %q in %s for --%s: %s", v, env[0], f.Name, valueHint(f, e))
		}
	}
	cmd.Flags().VisitAll(visit)
	cmd.InheritedFlags().VisitAll(visit)
	return err
}

// valueHint says what f takes, for a value it refused with err: the
// parser's own words (strconv.ParseInt: parsing "abc": invalid syntax)
// say nothing to an operator.
func valueHint(f *pflag.Flag, err error) string {
	switch f.Value.Type() {
	case "int", "int64", "int32", "uint", "uint64", "uint32":
		return "want a whole number"
	case "float64", "float32":
		return "want a number"
	case "duration":
		return "want a duration such as 500ms, 30s or 2m"
	case "bool":
		return "want true or false"
	}
	return err.Error()
}

// badFlagValue matches pflag's error for a value a flag refused.
var badFlagValue = regexp.MustCompile(`^invalid argument "(.*)" for "(?:-\w, )?--([\w-]+)" flag: `)

// flagError rewrites pflag's error for a refused value in valueHint's words;
// other command-line errors stay as they are.
func flagError(cmd *cobra.Command, err error) error {
	m := badFlagValue.FindStringSubmatch(err.Error())
	if m == nil {
		return err
	}
	f := cmd.Flags().Lookup(m[2])
	if f == nil {
		return err
	}
	return fmt.Errorf("invalid value %q for --%s: %s", m[1], f.Name, valueHint(f, err))
}

// usageError is an error in the command line: exit code 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usageErrorf(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

// exitCodeError is a runtime failure with its own exit code, for commands
// whose callers (monitoring scripts) tell outcomes apart by status.
type exitCodeError struct {
	code int
	err  error
}

func (e exitCodeError) Error() string { return e.err.Error() }
func (e exitCodeError) Unwrap() error { return e.err }

// report prints err as one line on stderr and returns the exit code.
func (a *app) report(cmd *cobra.Command, err error) int {
	fmt.Fprintln(a.stderr, oneLine(err))
	if ce := (exitCodeError{}); errors.As(err, &ce) {
		return ce.code
	}
	var ue usageError
	if !a.ran || errors.As(err, &ue) {
		path := "idem"
		if cmd != nil {
			path = cmd.CommandPath()
		}
		fmt.Fprintf(a.stderr, "Run '%s --help' for usage.\n", path)
		return exitUsage
	}
	return exitFailure
}

// oneLine formats err as the single "idem: …" line the CLI prints. Each
// layer of an error chain may have put its package's name in front
// ("idempgx: idem: lease lost"); the line names the program once. Leading
// prefixes that name idem or one of its packages are dropped: every package
// of the project that prefixes its errors is named idem-something (idem,
// idemsqlite, idemhttp, idemkafka…), so new stores and brokers need no
// change here. Further in, "idem: " (a sentinel's text, such as
// idem.ErrInvalidConfig's, wrapped by a layer that put its own words first)
// goes too. Other prefixes ("migrate: ", "inbox: ") say where it failed and
// stay, once: a prefix that repeats the one before it goes. Line breaks and
// runs of spaces become one space.
func oneLine(err error) string {
	msg := strings.Join(strings.Fields(err.Error()), " ")
	for {
		pkg, rest, ok := strings.Cut(msg, ": ")
		if !ok || !strings.HasPrefix(pkg, "idem") || !isWord(pkg) {
			break
		}
		msg = rest
	}
	parts := strings.Split(msg, ": ")
	kept := parts[:1]
	for i, p := range parts[1:] {
		last := i == len(parts)-2
		if prev := kept[len(kept)-1]; !last && (p == "idem" || p == prev && isWord(p)) {
			continue
		}
		kept = append(kept, p)
	}
	return "idem: " + strings.Join(kept, ": ")
}

// isWord reports whether s looks like a package or operation name that an
// error layer puts in front of the message: lower-case letters, digits and
// underscores.
func isWord(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '_' {
			return false
		}
	}
	return true
}

// writeJSON writes v as indented JSON: the --json output of every command.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// isTerminal reports whether w is a terminal (a character device), where
// progress may be one line rewritten in place.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
