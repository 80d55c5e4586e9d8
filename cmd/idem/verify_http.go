package main

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/idem-go/idem/cmd/idem/internal/httpcheck"
	"github.com/spf13/cobra"
)

// verifyHTTPOptions are the flags of "idem verify http" that are not
// httpcheck.Config fields as they are.
type verifyHTTPOptions struct {
	body, mismatchBody  string
	headers, principalA []string
	principalB          []string
	json                bool
	cfg                 httpcheck.Config
}

func newVerifyHTTPCmd(*app) *cobra.Command {
	var o verifyHTTPOptions
	cmd := &cobra.Command{
		Use:   "http --url URL",
		Short: "Check that an HTTP endpoint keeps the Idempotency-Key contract (exit 1 if not)",
		Long: `Sends a live endpoint (yours: behind idem proxy, the idemhttp middleware, or
your own implementation) the requests that break idempotency keys, and prints
one line per check, PASS, FAIL, WARN or SKIP with its evidence:

  replay           a retry after completion gets the same status and body, with
                   the replay marker (--replay-header)
  storm            --requests requests with one fresh key at once: one execution,
                   the others 409 with Retry-After or the replay
  in flight        retries sent while the first runs get 409 with a valid
                   Retry-After, or wait and get the replay
  mismatch         the same key with another body gets --mismatch-status (422)
                   and runs nothing
  missing key      400 with --require-key, a pass-through otherwise
  key limits       a 255-byte key works; 4096 bytes, non-ASCII and empty keys
                   are refused; none runs twice
  disconnect       a request whose connection is cut right after it was sent
                   (and one cut half an execution later), then its retry: one
                   execution in all
  scope isolation  with --principal-a and --principal-b: B never gets A's answer
  expiry           with --ttl: once the retention passed, the key runs again

Every check uses fresh keys "idem-verify-<check>-<random>". The operation runs
for real, some 15 times plus the storm: point it at a test deployment. Bodies
that are byte-identical prove little (a server may answer two runs alike):
--count-url (a GET answering how many times the operation ran, a number or a
JSON document with it at --count-pointer) or --same (a JSON pointer such as /id
into the answer, one value per execution) make the evidence; without them a
check that cannot tell a replay from a run says WARN.

Bounded: --requests (at most 100) plus a fixed few dozen requests, at --rate per
second, no redirects followed; only loopback targets unless --i-own-this-target
(every address the host resolves to is checked, and each connection's). Values
of Authorization, Cookie and the principals' headers never appear in the
output. Exit status: 0 when no check failed, 1 when one did, 2 for a wrong
command line, 130 when interrupted.`,
		Example: `  idem verify http --url http://127.0.0.1:8080/orders --body '{"sku":"x","qty":1}' \
    -H 'Authorization: Bearer test-a' --count-url http://127.0.0.1:8081/count \
    --principal-a 'Authorization: Bearer test-a' --principal-b 'Authorization: Bearer test-b'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := o.config()
			if err != nil {
				return err
			}
			return runVerifyHTTP(cmd, cfg, o.json)
		},
	}
	f := cmd.Flags()
	c := &o.cfg
	f.StringVar(&c.URL, "url", "", "the endpoint to check (required)")
	f.StringVar(&c.Method, "method", http.MethodPost, "request method")
	f.StringVar(&o.body, "body", "", "request body: JSON, or @file for any body (Content-Type defaults to application/json)")
	f.StringArrayVarP(&o.headers, "header", "H", nil, "request header 'Name: value', sent with every request (repeatable)")
	f.StringVar(&c.KeyHeader, "key-header", httpcheck.DefaultKeyHeader, "the idempotency key's header")
	f.BoolVar(&c.RequireKey, "require-key", false, "the endpoint must answer 400 to a request without a key")
	f.StringVar(&o.mismatchBody, "mismatch-body", "", "the other body of the mismatch check, JSON or @file (default: the body with one member added)")
	f.IntVar(&c.MismatchStatus, "mismatch-status", httpcheck.DefaultMismatchStatus, "status expected for a key reused with another body")
	f.StringVar(&c.ReplayHeader, "replay-header", httpcheck.DefaultReplayHeader, "header whose value true marks a replayed answer")
	f.StringVar(&c.CountURL, "count-url", "", "URL answering GET with the number of executions (a number, or JSON with --count-pointer)")
	f.StringVar(&c.CountPointer, "count-pointer", "", "JSON pointer to the count in --count-url's answer, such as /executions")
	f.StringVar(&c.Same, "same", "", "JSON pointer into the answer identifying one execution, such as /id")
	f.StringArrayVar(&o.principalA, "principal-a", nil, "header 'Name: value' of principal A for scope isolation (repeatable)")
	f.StringArrayVar(&o.principalB, "principal-b", nil, "header 'Name: value' of principal B for scope isolation (repeatable)")
	f.DurationVar(&c.TTL, "ttl", 0, fmt.Sprintf("the endpoint's key retention; the expiry check waits it out once (0: skipped; at most %v)", httpcheck.MaxTTL))
	f.IntVar(&c.Requests, "requests", httpcheck.DefaultRequests, fmt.Sprintf("requests of the storm (2-%d)", httpcheck.MaxRequests))
	f.Float64Var(&c.Rate, "rate", httpcheck.DefaultRate, fmt.Sprintf("most requests per second (1-%d; the storm is one burst)", httpcheck.MaxRate))
	f.DurationVar(&c.Timeout, "timeout", httpcheck.DefaultTimeout, "bound on each request")
	f.BoolVar(&c.AllowRemote, "i-own-this-target", false, "allow a target that is not loopback: only one you own and may load")
	f.BoolVar(&o.json, "json", false, `print one JSON report: {"target", "method", "key_header", "checks": [{"name", "result", "evidence", "seconds"}], "requests", "passed", "interrupted"}`)
	return cmd
}

// config builds the httpcheck.Config from the flags; every error is a
// usage error.
func (o verifyHTTPOptions) config() (httpcheck.Config, error) {
	cfg := o.cfg
	if cfg.URL == "" {
		return cfg, usageErrorf("--url is required")
	}
	var err error
	if o.body != "" {
		if cfg.Body, err = httpcheck.ParseBody(o.body); err != nil {
			return cfg, usageErrorf("--body: %v", strings.TrimPrefix(err.Error(), "body: "))
		}
	}
	if o.mismatchBody != "" {
		if cfg.MismatchBody, err = httpcheck.ParseBody(o.mismatchBody); err != nil {
			return cfg, usageErrorf("--mismatch-body: %v", strings.TrimPrefix(err.Error(), "body: "))
		}
	}
	for _, h := range []struct {
		flag  string
		lines []string
		dst   *http.Header
	}{{"-H", o.headers, &cfg.Header}, {"--principal-a", o.principalA, &cfg.PrincipalA}, {"--principal-b", o.principalB, &cfg.PrincipalB}} {
		for _, line := range h.lines {
			name, value, err := httpcheck.ParseHeader(line)
			if err != nil {
				return cfg, usageErrorf("%s: %v", h.flag, err)
			}
			if *h.dst == nil {
				*h.dst = http.Header{}
			}
			h.dst.Add(name, value)
		}
	}
	return cfg, nil
}

func runVerifyHTTP(cmd *cobra.Command, cfg httpcheck.Config, asJSON bool) error {
	w := cmd.OutOrStdout()
	ctx := cmd.Context()
	each := func(c httpcheck.CheckResult) {
		if !asJSON {
			fmt.Fprintf(w, "%-4s  %-15s %s (%v)\n", c.Result, c.Name, c.Evidence, time.Duration(c.Seconds*float64(time.Second)).Round(time.Millisecond))
		}
	}
	rep, err := httpcheck.Run(ctx, cfg, each)
	switch {
	case errors.Is(err, httpcheck.ErrConfig), errors.Is(err, httpcheck.ErrRemote):
		return usageError{err}
	case err != nil:
		return err
	}
	if asJSON {
		if err := writeJSON(w, rep); err != nil {
			return err
		}
	}
	counts := map[httpcheck.Result]int{}
	for _, c := range rep.Checks {
		counts[c.Result]++
	}
	if !asJSON {
		fmt.Fprintf(w, "%s %s: %d passed, %d warned, %d skipped, %d failed; %d requests\n", rep.Method, rep.Target,
			counts[httpcheck.Pass], counts[httpcheck.Warn], counts[httpcheck.Skip], counts[httpcheck.Fail], rep.Requests)
	}
	switch failed := rep.Failed(); {
	case rep.Interrupted:
		return exitCodeError{exitInterrupted, errors.New("verify http interrupted")}
	case len(failed) > 0:
		return fmt.Errorf("%w: %d of %d checks failed (%s): %s does not keep the Idempotency-Key contract",
			errVerifyFailed, len(failed), len(rep.Checks), strings.Join(failed, ", "), rep.Target)
	}
	return nil
}
