// Package console is the web console of "idem console": an on-call
// engineer's view of one idem store (its records, with the HTTP responses
// the middleware and the proxy stored), its inbox and the dead-letter queues
// of the brokers it is given.
//
// The server is a plain [http.Handler] built by [New] from what the command
// line opened: an idem.Store (an idem.Lister when it can list), an
// inbox.Admin (nil when the store has none) and any number of
// [DeadLetterQueue]s. Pages are rendered on the server with html/template;
// charts are inline SVG; the one style sheet and the one small script are
// embedded files, so the binary serves everything and the Content Security
// Policy allows no inline script or style.
//
// # Safety
//
//   - Authentication: with a token ([Config.Token]) every request needs
//     either "Authorization: Bearer TOKEN" or the HttpOnly, SameSite=Strict
//     session cookie the login form sets; comparisons are constant-time.
//     [CheckListen] refuses a non-loopback address without a token.
//   - Every POST carries a CSRF token (double-submit: a random
//     SameSite=Strict cookie and a form field, compared in constant time) and
//     is refused when its Origin (or Sec-Fetch-Site) is another site's.
//   - [Config.ReadOnly] refuses every action with 403 and hides its buttons.
//   - Discarding inbox rows, the one destructive action, asks for a
//     confirmation on a page of its own before it runs.
//   - Everything shown is bounded: page sizes ([MaxPageSize]), the work one
//     search or one overview does, the bytes of a body or payload shown.
//     Stored responses never carry Authorization, Cookie or Set-Cookie
//     (idemhttp never stores them); the console drops them anyway.
//   - Every action and every refused one is logged with slog, with who did
//     it (the token's identity or "anonymous", and the remote address).
package console
