package main

import "testing"

func TestDemoRequestsFlag(t *testing.T) {
	t.Parallel()
	wantExit(t, runCLI(t, nil, "demo", "--requests", "-1"), exitUsage, "--requests must be between 0 and 1000")
	wantExit(t, runCLI(t, nil, "demo", "--requests", "1001"), exitUsage, "--requests must be between 0 and 1000")
	wantExit(t, runCLI(t, map[string]string{"IDEM_DEMO_REQUESTS": "many"}, "demo"), exitUsage, `invalid value "many" in IDEM_DEMO_REQUESTS`)
}
