package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/retry"
	"github.com/spf13/cobra"
)

func init() { commands = append(commands, newVerifyCmd) }

// verifyOptions are verify's flags.
type verifyOptions struct {
	keys, copies, workers int
	lease, wait           time.Duration
	// keep leaves the verification's records in the store.
	keep bool
	// json prints one JSON report at the end instead of lines.
	json bool
	// store names the store in the report; progress, every how often the
	// storm reports how far it got (0: never), and on a terminal (tty) as
	// one line rewritten in place.
	store    string
	progress time.Duration
	tty      bool
}

// exitInterrupted is verify's exit code when Ctrl-C or SIGTERM cut it short
// (128 + SIGINT, as shells report it).
const exitInterrupted = 130

// Bounds that keep a verification from becoming a load test of production.
const (
	maxVerifyKeys    = 10000
	maxVerifyCopies  = 100
	maxVerifyWorkers = 256
	minVerifyLease   = 200 * time.Millisecond
	maxVerifyLease   = time.Minute
)

func newVerifyCmd(a *app) *cobra.Command {
	var (
		cfg *storeConfig
		o   verifyOptions
	)
	cmd := &cobra.Command{
		Use:   "verify",
		Short: "Check that a store keeps its contract under a duplicate storm (exit 1 if not)",
		Long: `Runs the store contract that idem's exactly-once effects rest on against the
store --store names (the same one your services use), and prints one line per
check:

  duplicate storm  --keys operations, each called --copies times at once from
                   --workers goroutines through idem.Guard: every operation must
                   run exactly once, and every copy must get back the result of
                   that one run, byte for byte
  fingerprint      the same key with another request is refused (Mismatch), on
                   a completed key and on one in progress
  fencing          a lease that expires by the store's clock is taken over with a
                   greater token; the old holder's complete, extend and release
                   are refused (ErrLeaseLost) and the new holder's result stands
  release          a released key runs again, with a greater token
  store clock      the store's clock against this machine's (information: leases
                   are measured by the store's clock alone)

Everything is written under a scope of its own (idem-verify/<random>) and deleted
at the end (--keep keeps it), also when a check fails or the run is interrupted;
Redis keeps a small token stub per deleted key for an hour so that fencing
tokens never go back. The storm reports its progress (calls done, rate, time
left) every few seconds, on one line on a terminal. The fencing check waits out
one --lease. The exit status is 0 only when every check passes, 1 when one
fails, 130 when Ctrl-C (or SIGTERM) interrupted it.

"idem verify http" checks an HTTP endpoint the same way: yours, behind idem
proxy, the idemhttp middleware or an Idempotency-Key implementation of your own.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.validate(); err != nil {
				return err
			}
			b, err := lookupBackend(cfg.DSN)
			if err != nil {
				return err
			}
			o.store = b.Name + " store " + describeStore(b, *cfg)
			o.progress, o.tty = 5*time.Second, isTerminal(cmd.OutOrStdout())
			if o.tty {
				o.progress = 500 * time.Millisecond
			}
			return withStore(cmd, cfg, func(s idem.Store) error {
				return runVerify(cmd.Context(), cmd.OutOrStdout(), s, o)
			})
		},
	}
	cfg = addStoreFlags(cmd)
	f := cmd.Flags()
	f.IntVar(&o.keys, "keys", 200, fmt.Sprintf("distinct operations in the duplicate storm (1-%d)", maxVerifyKeys))
	f.IntVar(&o.copies, "copies", 10, fmt.Sprintf("concurrent calls of each operation (2-%d)", maxVerifyCopies))
	f.IntVar(&o.workers, "workers", 32, fmt.Sprintf("goroutines making the calls (1-%d)", maxVerifyWorkers))
	f.DurationVar(&o.lease, "lease", time.Second, fmt.Sprintf("lease of the fencing check, waited out once (%v-%v)", minVerifyLease, maxVerifyLease))
	f.DurationVar(&o.wait, "wait", 30*time.Second, "how long a copy waits for the run in progress before the storm fails")
	f.BoolVar(&o.keep, "keep", false, "keep the verification's records in the store (to inspect them)")
	f.BoolVar(&o.json, "json", false, `print one JSON report at the end: {"store", "scope", "checks": [{"name", "ok", "detail", "error", "seconds"}], "passed", "interrupted", "kept", "cleanup_error"}`)
	for _, name := range []string{"keys", "copies", "workers", "lease", "wait", "keep", "json"} {
		envFlag(cmd, name, "IDEM_VERIFY_"+strings.ToUpper(name))
	}
	cmd.AddCommand(newVerifyHTTPCmd(a))
	return cmd
}

func (o verifyOptions) validate() error {
	switch {
	case o.keys < 1 || o.keys > maxVerifyKeys:
		return usageErrorf("--keys must be 1-%d, got %d", maxVerifyKeys, o.keys)
	case o.copies < 2 || o.copies > maxVerifyCopies:
		return usageErrorf("--copies must be 2-%d, got %d", maxVerifyCopies, o.copies)
	case o.workers < 1 || o.workers > maxVerifyWorkers:
		return usageErrorf("--workers must be 1-%d, got %d", maxVerifyWorkers, o.workers)
	case o.lease < minVerifyLease || o.lease > maxVerifyLease:
		return usageErrorf("--lease must be %v-%v, got %v", minVerifyLease, maxVerifyLease, o.lease)
	case o.wait <= 0:
		return usageErrorf("--wait must be positive, got %v", o.wait)
	}
	return nil
}

// verifier runs the checks against one store under one scope and remembers
// the keys it wrote, to delete them at the end.
type verifier struct {
	store idem.Store
	scope string
	o     verifyOptions
	w     io.Writer // the report, for progress lines

	mu      sync.Mutex
	written []string
}

// verifyCheck is one named check; it returns a one-line detail, or an error
// that says what broke the contract.
type verifyCheck struct {
	name string
	run  func(v *verifier, ctx context.Context) (string, error)
}

var verifyChecks = []verifyCheck{
	{"duplicate storm", (*verifier).storm},
	{"fingerprint", (*verifier).fingerprint},
	{"fencing", (*verifier).fencing},
	{"release", (*verifier).release},
	{"store clock", (*verifier).clock},
}

// errVerifyFailed is returned when a check failed; each failure was printed.
var errVerifyFailed = errors.New("verify")

// runVerify runs every check and prints "ok" or "FAIL" with a detail for
// each. It returns an error when any check failed or the cleanup did.
func runVerify(ctx context.Context, w io.Writer, s idem.Store, o verifyOptions) error {
	var nonce [6]byte
	_, _ = rand.Read(nonce[:])
	report := w
	if o.json {
		w, o.progress = io.Discard, 0 // the report is the JSON document
	}
	v := &verifier{store: s, scope: "idem-verify/" + hex.EncodeToString(nonce[:]), o: o, w: w}
	rep := verifyReport{Store: o.store, Scope: v.scope, Checks: []verifyCheckJSON{}}
	if rep.Store == "" {
		rep.Store = fmt.Sprintf("%T", s)
	}
	fmt.Fprintf(w, "verifying %s under scope %q\n", rep.Store, v.scope)
	failed := 0
	for _, c := range verifyChecks {
		start := time.Now()
		detail, err := c.run(v, ctx)
		took := time.Since(start).Round(time.Millisecond)
		if ctx.Err() != nil {
			fmt.Fprintf(w, "interrupted during %s (%v)\n", c.name, took)
			rep.Interrupted = true
			break
		}
		check := verifyCheckJSON{Name: c.name, OK: err == nil, Detail: detail, Seconds: took.Seconds()}
		if err != nil {
			failed++
			check.Error = err.Error()
			fmt.Fprintf(w, "FAIL  %-16s %v (%v)\n", c.name, err, took)
		} else {
			fmt.Fprintf(w, "ok    %-16s %s (%v)\n", c.name, detail, took)
		}
		rep.Checks = append(rep.Checks, check)
	}
	var cleanErr error
	if o.keep {
		rep.Kept = true
		fmt.Fprintf(w, "kept %d keys under scope %q (--keep)\n", len(v.written), v.scope)
	} else if cleanErr = v.cleanup(context.WithoutCancel(ctx)); cleanErr != nil {
		rep.CleanupError = cleanErr.Error()
		fmt.Fprintf(w, "FAIL  %-16s %v\n", "cleanup", cleanErr)
	}
	rep.Passed = failed == 0 && cleanErr == nil && !rep.Interrupted
	if o.json {
		if err := writeJSON(report, rep); err != nil {
			return err
		}
	}
	switch {
	case ctx.Err() != nil && cleanErr != nil:
		return exitCodeError{exitInterrupted, fmt.Errorf("verify interrupted, and the cleanup of scope %q failed: %w", v.scope, cleanErr)}
	case ctx.Err() != nil && o.keep:
		return exitCodeError{exitInterrupted, fmt.Errorf("verify interrupted; its records are kept under scope %q", v.scope)}
	case ctx.Err() != nil:
		return exitCodeError{exitInterrupted, fmt.Errorf("verify interrupted; its records under scope %q were deleted", v.scope)}
	case failed > 0:
		return fmt.Errorf("%w: %d of %d checks failed; the store does not keep idem's contract", errVerifyFailed, failed, len(verifyChecks))
	case cleanErr != nil:
		return fmt.Errorf("%w: every check passed, but the cleanup of scope %q failed: %w", errVerifyFailed, v.scope, cleanErr)
	}
	fmt.Fprintf(w, "all %d checks passed\n", len(verifyChecks))
	return nil
}

// verifyReport is the output of "verify --json".
type verifyReport struct {
	Store        string            `json:"store"`
	Scope        string            `json:"scope"`
	Checks       []verifyCheckJSON `json:"checks"`
	Passed       bool              `json:"passed"`
	Interrupted  bool              `json:"interrupted,omitempty"`
	Kept         bool              `json:"kept,omitempty"`
	CleanupError string            `json:"cleanup_error,omitempty"`
}

// verifyCheckJSON is one check of "verify --json".
type verifyCheckJSON struct {
	Name    string  `json:"name"`
	OK      bool    `json:"ok"`
	Detail  string  `json:"detail,omitempty"`
	Error   string  `json:"error,omitempty"`
	Seconds float64 `json:"seconds"`
}

// key returns a fresh key of the verification and remembers it.
func (v *verifier) key(name string) string {
	v.mu.Lock()
	defer v.mu.Unlock()
	k := fmt.Sprintf("%s-%d", name, len(v.written))
	v.written = append(v.written, k)
	return k
}

// cleanup deletes every key the checks wrote (a key never written is not an
// error).
func (v *verifier) cleanup(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	v.mu.Lock()
	keys := v.written
	v.mu.Unlock()
	var errs []error
	for _, k := range keys {
		if err := v.store.Delete(ctx, v.scope, k); err != nil && !errors.Is(err, idem.ErrNotFound) {
			errs = append(errs, fmt.Errorf("delete %q: %w", k, err))
			if len(errs) == 3 {
				break
			}
		}
	}
	return errors.Join(errs...)
}

// storm calls each of o.keys operations o.copies times at once, from
// o.workers goroutines, in a shuffled order. Each run returns a value of its
// own (a counter), so a second run of an operation and a wrong replay both
// show.
func (v *verifier) storm(ctx context.Context) (string, error) {
	g := idem.NewGuard(v.store, &idem.GuardConfig{Wait: v.o.wait, Lease: 30 * time.Second, Logger: slog.New(slog.DiscardHandler)})
	keys := make([]string, v.o.keys)
	for i := range keys {
		keys[i] = v.key("storm")
	}
	calls := make([]int, 0, len(keys)*v.o.copies)
	for i := range keys {
		for range v.o.copies {
			calls = append(calls, i)
		}
	}
	mrand.Shuffle(len(calls), func(i, j int) { calls[i], calls[j] = calls[j], calls[i] })

	runs := make([]atomic.Int64, len(keys))
	results := make([][][]byte, len(keys))
	var (
		seq, replays atomic.Int64
		next, done   atomic.Int64
		mu           sync.Mutex
		firstErr     error
		wg           sync.WaitGroup
	)
	stopProgress := v.reportProgress(&done, len(calls))
	defer stopProgress()
	for range v.o.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				n := int(next.Add(1)) - 1
				if n >= len(calls) || ctx.Err() != nil {
					return
				}
				i := calls[n]
				call := idem.Call{Scope: v.scope, Key: keys[i], Fingerprint: idem.FingerprintBytes([]byte(keys[i]))}
				res, err := g.Do(ctx, call, func(context.Context, idem.Run) ([]byte, error) {
					runs[i].Add(1)
					return fmt.Appendf(nil, "run %d of %s", seq.Add(1), keys[i]), nil
				})
				done.Add(1)
				mu.Lock()
				if err != nil {
					if firstErr == nil {
						firstErr = fmt.Errorf("call of %q: %w", keys[i], err)
					}
				} else {
					results[i] = append(results[i], res.Value)
					if res.Replayed {
						replays.Add(1)
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return "", firstErr
	}
	if err := ctx.Err(); err != nil {
		return "", err
	}
	for i, k := range keys {
		if n := runs[i].Load(); n != 1 {
			return "", fmt.Errorf("operation %q ran %d times, want exactly once", k, n)
		}
		for _, r := range results[i] {
			if !bytes.Equal(r, results[i][0]) {
				return "", fmt.Errorf("operation %q: a copy got %q, another %q: every copy must get the one run's result", k, r, results[i][0])
			}
		}
	}
	total := len(calls)
	return fmt.Sprintf("%d calls of %d operations from %d goroutines: each ran once, %d copies replayed its result",
		total, len(keys), v.o.workers, replays.Load()), nil
}

// reportProgress prints, every v.o.progress until the returned function is
// called, how many of total calls are done, their rate and the time left:
// one line rewritten in place on a terminal, a line each otherwise.
func (v *verifier) reportProgress(done *atomic.Int64, total int) (stop func()) {
	if v.o.progress <= 0 || v.w == nil {
		return func() {}
	}
	start := time.Now()
	quit, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		t := time.NewTicker(v.o.progress)
		defer t.Stop()
		for {
			select {
			case <-quit:
				if v.o.tty {
					fmt.Fprint(v.w, "\r\033[K") // the final report replaces the line
				}
				return
			case <-t.C:
				fmt.Fprint(v.w, progressLine(int(done.Load()), total, time.Since(start), v.o.tty))
			}
		}
	}()
	return func() { close(quit); <-finished }
}

// progressLine is one progress report of the storm.
func progressLine(done, total int, elapsed time.Duration, tty bool) string {
	line := fmt.Sprintf("storm: %d/%d calls", done, total)
	if done > 0 && elapsed > 0 {
		rate := float64(done) / elapsed.Seconds()
		left := time.Duration(float64(total-done) / rate * float64(time.Second)).Round(time.Second)
		line += fmt.Sprintf(" (%.0f/s, about %v left)", rate, left)
	}
	if tty {
		return "\r\033[K" + line
	}
	return line + "\n"
}

// acquire claims req, which must be a fresh key of the verification.
func (v *verifier) acquire(ctx context.Context, req idem.ClaimRequest, what string) (idem.Claim, error) {
	c, err := v.store.Claim(ctx, req)
	if err == nil && c.Outcome != idem.Acquired {
		err = fmt.Errorf("%s: %v, want acquired", what, c.Outcome)
	}
	return c, err
}

// fingerprint checks that a key used with another request is refused, both
// while it runs and once it completed.
func (v *verifier) fingerprint(ctx context.Context) (string, error) {
	k := v.key("fingerprint")
	a, b := idem.FingerprintBytes([]byte("request A")), idem.FingerprintBytes([]byte("request B"))
	c, err := v.acquire(ctx, idem.ClaimRequest{Scope: v.scope, Key: k, Fingerprint: a, Lease: 30 * time.Second}, "first claim of a new key")
	if err != nil {
		return "", err
	}
	if got, err := v.store.Claim(ctx, idem.ClaimRequest{Scope: v.scope, Key: k, Fingerprint: b, Lease: 30 * time.Second}); err != nil {
		return "", err
	} else if got.Outcome != idem.Mismatch {
		return "", fmt.Errorf("another request on a key in progress: %v, want mismatch", got.Outcome)
	}
	if err := v.store.Complete(ctx, idem.CompleteRequest{Scope: v.scope, Key: k, Token: c.Token, Result: []byte("A"), Retention: time.Hour}); err != nil {
		return "", err
	}
	got, err := v.store.Claim(ctx, idem.ClaimRequest{Scope: v.scope, Key: k, Fingerprint: b, Lease: 30 * time.Second})
	if err != nil {
		return "", err
	}
	if got.Outcome != idem.Mismatch {
		return "", fmt.Errorf("another request on a completed key: %v, want mismatch", got.Outcome)
	}
	if got, err = v.store.Claim(ctx, idem.ClaimRequest{Scope: v.scope, Key: k, Fingerprint: a, Lease: 30 * time.Second}); err != nil {
		return "", err
	}
	if got.Outcome != idem.Completed || got.Record == nil || string(got.Record.Result) != "A" {
		return "", fmt.Errorf("the same request on a completed key: %v, want completed with its result", got.Outcome)
	}
	return "another request on the same key is refused, in progress and completed", nil
}

// fencing lets a lease expire and checks the takeover and the old holder's
// refusals.
func (v *verifier) fencing(ctx context.Context) (string, error) {
	k := v.key("fencing")
	fp := idem.FingerprintBytes([]byte("fencing"))
	req := idem.ClaimRequest{Scope: v.scope, Key: k, Fingerprint: fp, Lease: v.o.lease}
	old, err := v.acquire(ctx, req, "first claim")
	if err != nil {
		return "", err
	}
	if got, err := v.store.Claim(ctx, req); err != nil {
		return "", err
	} else if got.Outcome != idem.InProgress {
		return "", fmt.Errorf("claim during a live lease: %v, want in_progress", got.Outcome)
	}
	// Wait out the lease by the store's clock: poll until the claim is
	// taken over, for at most a few leases (a store clock far ahead of or
	// behind ours shows in the store clock check, not here).
	deadline := time.Now().Add(3*v.o.lease + 5*time.Second)
	var cur idem.Claim
	for {
		if err := retry.Sleep(ctx, v.o.lease/4); err != nil {
			return "", err
		}
		cur, err = v.store.Claim(ctx, req)
		if err != nil {
			return "", err
		}
		if cur.Outcome == idem.Acquired {
			break
		}
		if cur.Outcome != idem.InProgress || time.Now().After(deadline) {
			return "", fmt.Errorf("claim after the lease expired: %v, want acquired (takeover)", cur.Outcome)
		}
	}
	if !cur.Takeover || cur.Token <= old.Token {
		return "", fmt.Errorf("takeover: token %d after %d, takeover=%v; want a greater token and takeover", cur.Token, old.Token, cur.Takeover)
	}
	if _, err := v.store.Extend(ctx, v.scope, k, old.Token, v.o.lease); !errors.Is(err, idem.ErrLeaseLost) {
		return "", fmt.Errorf("extend by the old holder: %v, want ErrLeaseLost", err)
	}
	err = v.store.Complete(ctx, idem.CompleteRequest{Scope: v.scope, Key: k, Token: old.Token, Result: []byte("stale"), Retention: time.Hour})
	if !errors.Is(err, idem.ErrLeaseLost) {
		return "", fmt.Errorf("complete by the old holder: %v, want ErrLeaseLost", err)
	}
	if err := v.store.Release(ctx, v.scope, k, old.Token); !errors.Is(err, idem.ErrLeaseLost) {
		return "", fmt.Errorf("release by the old holder: %v, want ErrLeaseLost", err)
	}
	if err := v.store.Complete(ctx, idem.CompleteRequest{Scope: v.scope, Key: k, Token: cur.Token, Result: []byte("current"), Retention: time.Hour}); err != nil {
		return "", fmt.Errorf("complete by the new holder: %w", err)
	}
	rec, err := v.store.Get(ctx, v.scope, k)
	if err != nil {
		return "", err
	}
	if rec.State != idem.StateCompleted || string(rec.Result) != "current" || rec.Token != cur.Token {
		return "", fmt.Errorf("record after the takeover: state %s, result %q, token %d; want completed, %q, %d", rec.State, rec.Result, rec.Token, "current", cur.Token)
	}
	return fmt.Sprintf("takeover with token %d after %d; the old holder is refused", cur.Token, old.Token), nil
}

// release checks that a released key runs again with a greater token.
func (v *verifier) release(ctx context.Context) (string, error) {
	k := v.key("release")
	req := idem.ClaimRequest{Scope: v.scope, Key: k, Fingerprint: idem.FingerprintBytes([]byte("release")), Lease: 30 * time.Second}
	first, err := v.acquire(ctx, req, "first claim")
	if err != nil {
		return "", err
	}
	if err := v.store.Release(ctx, v.scope, k, first.Token); err != nil {
		return "", fmt.Errorf("release: %w", err)
	}
	again, err := v.store.Claim(ctx, req)
	if err != nil {
		return "", err
	}
	if again.Outcome != idem.Acquired || again.Token <= first.Token {
		return "", fmt.Errorf("claim after release: %v with token %d after %d, want acquired with a greater token", again.Outcome, again.Token, first.Token)
	}
	if err := v.store.Release(ctx, v.scope, k, again.Token); err != nil {
		return "", fmt.Errorf("second release: %w", err)
	}
	return fmt.Sprintf("claimed again with token %d after %d", again.Token, first.Token), nil
}

// clock compares the lease expiry the store reports with this machine's
// clock. Leases only use the store's clock, so this is information, unless
// the store reports no expiry at all.
func (v *verifier) clock(ctx context.Context) (string, error) {
	k := v.key("clock")
	lease := 30 * time.Second
	before := time.Now()
	c, err := v.acquire(ctx, idem.ClaimRequest{Scope: v.scope, Key: k, Fingerprint: idem.FingerprintBytes([]byte("clock")), Lease: lease}, "claim")
	after := time.Now()
	if err != nil {
		return "", err
	}
	if err := v.store.Release(ctx, v.scope, k, c.Token); err != nil {
		return "", fmt.Errorf("release: %w", err)
	}
	if c.LeaseExpiresAt.IsZero() {
		return "", errors.New("the store reported no lease expiry")
	}
	storeNow := c.LeaseExpiresAt.Add(-lease)
	var skew time.Duration
	switch {
	case storeNow.Before(before):
		skew = storeNow.Sub(before)
	case storeNow.After(after):
		skew = storeNow.Sub(after)
	}
	rtt := after.Sub(before).Round(10 * time.Microsecond)
	// Stores keep milliseconds (Redis) or microseconds: a few milliseconds
	// are resolution, not skew.
	if skew.Abs() < 5*time.Millisecond {
		return fmt.Sprintf("within this machine's clock ±%v (one round trip)", rtt), nil
	}
	return fmt.Sprintf("%v from this machine's clock (round trip %v); leases use the store's clock only", skew.Round(time.Millisecond), rtt), nil
}
