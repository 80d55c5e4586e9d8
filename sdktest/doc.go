// Package sdktest holds only tests: it proves that idemhttp's error
// responses and replays read correctly to client libraries written by
// others — Stripe's Go SDK (stripe-go) and its Node SDK (the stripe npm
// package) — talking HTTP to a real server wrapped by idemhttp.
package sdktest
