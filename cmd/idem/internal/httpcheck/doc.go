// Package httpcheck is the black-box checker behind "idem verify http": it
// sends a live endpoint the requests that break idempotency-key
// implementations (a storm of one key, a retry, the same key with another
// body, a cut connection, two principals with one key, a key past its
// retention) and judges each answer by its status, its body, the replay
// marker and, when it is given, the server's own execution count.
//
// # Checks
//
// Each check uses fresh random keys, prefixed "idem-verify-<check>-" so
// that they are recognisable in the server's logs and store:
//
//   - replay: a retry after completion gets the same status and
//     byte-identical body, with the replay marker (Idempotent-Replayed);
//     it runs first, and when the endpoint does not answer it with a 2xx
//     every other check is skipped;
//   - storm: Config.Requests requests with one key at once give one
//     execution; the others get 409 with Retry-After or the replay;
//   - in flight: a retry sent while the first request runs gets 409 with a
//     valid Retry-After, or waits and gets the replay, never a second run;
//   - mismatch: the same key with another body gets Config.MismatchStatus
//     (422) and runs nothing; the first request's replay is untouched;
//   - missing key: 400 with Config.RequireKey, a plain pass-through
//     otherwise;
//   - key limits: a 255-byte key works; a 4096-byte key, a key outside
//     printable ASCII and an empty key are refused, and none ever runs
//     twice;
//   - disconnect: a request whose connection is cut right after its bytes
//     were written (a raw net.Conn, not http.Client), and one cut half an
//     execution later, each with its retry, run the operation once in all;
//   - scope isolation: with Config.PrincipalA and PrincipalB, B never gets
//     A's response for the same key;
//   - expiry: with Config.TTL, the key runs again once its retention
//     passed.
//
// # Evidence of executions
//
// Identical bodies prove little on their own: an endpoint that runs twice
// may answer twice the same. Config.CountURL (a GET answering the number of
// executions, or a JSON document with it at Config.CountPointer) and
// Config.Same (a JSON pointer such as /id into the response, one value per
// execution) are the evidence the checks prefer; without them a check that
// cannot tell a replay from a second run says so with WARN rather than
// PASS.
//
// # Bounds
//
// A run sends at most [MaxRequests] plus a fixed few dozen requests, at
// Config.Rate per second, never follows redirects, and connects only to
// loopback addresses unless Config.AllowRemote is set: every address the
// host resolves to is checked before the run, and every connection's
// address again when it is made. Values of Authorization, Cookie and the
// principals' headers never appear in the evidence.
//
// The package is internal: the checks' names and evidence are the CLI's
// output, and the API may change as checks are added.
package httpcheck
