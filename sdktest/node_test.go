package sdktest

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/idem-go/idem/idemhttp"
)

// nodeScript returns the node binary and the directory of the Node check,
// skipping the test when either node or the installed `stripe` package is
// missing — unless CI is set, where it must run and the test fails
// instead (as idemtest.ServiceURL does for backend servers).
func nodeScript(t *testing.T) (node, dir string) {
	t.Helper()
	dir, err := filepath.Abs("node")
	if err != nil {
		t.Fatal(err)
	}
	missing := ""
	node, err = exec.LookPath("node")
	switch {
	case err != nil:
		missing = "node is not installed"
	default:
		if _, err := os.Stat(filepath.Join(dir, "node_modules", "stripe", "package.json")); err != nil {
			missing = "the stripe npm package is not installed in sdktest/node"
		}
	}
	if missing == "" {
		return node, dir
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("%s; CI must run the Node SDK check (run `npm ci` in sdktest/node)", missing)
	}
	t.Skipf("%s; skipping (run `cd sdktest/node && npm ci` to run it)", missing)
	return "", ""
}

// TestStripeNodeSDK runs node/stripe_check.mjs, Stripe's own Node SDK,
// against the fake behind idemhttp, in both modes: one server with
// FormatStripe and one with the default FormatProblem. The script asserts
// the behaviours (see its checks and README.md) and exits non-zero if one
// fails; its JSON summary is logged.
func TestStripeNodeSDK(t *testing.T) {
	node, dir := nodeScript(t)
	for _, m := range modes {
		t.Run(string(m), func(t *testing.T) {
			t.Parallel() // each mode has its own servers; the SDK's retry sleeps dominate
			withStripe := newEnv(t, m, idemhttp.FormatStripe)
			withProblem := newEnv(t, m, idemhttp.FormatProblem)

			ctx, cancel := context.WithTimeout(t.Context(), 4*waitLimit)
			defer cancel()
			cmd := exec.CommandContext(ctx, node, "stripe_check.mjs", withStripe.URL, withProblem.URL)
			cmd.Dir = dir
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			runErr := cmd.Run()

			var summary struct {
				OK     bool `json:"ok"`
				Checks []struct {
					Name     string          `json:"name"`
					OK       bool            `json:"ok"`
					Failed   []string        `json:"failed"`
					Observed json.RawMessage `json:"observed"`
				} `json:"checks"`
			}
			if err := json.Unmarshal(stdout.Bytes(), &summary); err != nil {
				t.Fatalf("node stripe_check.mjs: %v; no JSON summary (%v)\nstdout:\n%s\nstderr:\n%s", runErr, err, stdout.String(), stderr.String())
			}
			t.Logf("node stripe_check.mjs summary:\n%s", stdout.String())
			for _, c := range summary.Checks {
				if !c.OK {
					t.Errorf("%s failed: %v\nobserved: %s", c.Name, c.Failed, c.Observed)
				}
			}
			if runErr != nil || !summary.OK || len(summary.Checks) == 0 {
				t.Fatalf("node stripe_check.mjs: exit %v, ok=%v, %d checks\nstderr:\n%s", runErr, summary.OK, len(summary.Checks), stderr.String())
			}
			if stderr.Len() > 0 {
				t.Logf("stderr:\n%s", stderr.String())
			}
		})
	}
}
