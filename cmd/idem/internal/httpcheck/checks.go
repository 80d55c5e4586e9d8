package httpcheck

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"time"

	"github.com/idem-go/idem/retry"
)

// counter is the server's execution count at the start of a check.
type counter struct {
	r      *runner
	before int64
	ok     bool
}

func (r *runner) startCount(ctx context.Context) (counter, error) {
	n, ok, err := r.count(ctx)
	return counter{r: r, before: n, ok: ok}, err
}

// delta returns how far the count moved since the check started and the
// evidence " (count a→b)". Every request of the check was answered, so
// their executions ended; checkDisconnect, which has one it cannot see,
// settles first.
func (c counter) delta(ctx context.Context) (int64, string, error) {
	if !c.ok {
		return 0, "", nil
	}
	n, _, err := c.r.count(ctx)
	if err != nil {
		return 0, "", err
	}
	return n - c.before, fmt.Sprintf(" (count %d→%d)", c.before, n), nil
}

// noEvidence is appended when only bodies could be compared.
func (r *runner) noEvidence() string {
	if r.cfg.CountURL == "" && r.cfg.Same == "" {
		return "; judged by bodies alone (--count-url or --same proves executions)"
	}
	return ""
}

// sameAnswer reports whether b is a's answer again: same status, same
// body, same --same value.
func (r *runner) sameAnswer(a, b response) bool {
	if a.err != nil || b.err != nil || a.status != b.status || !bytes.Equal(a.body, b.body) {
		return false
	}
	va, oka := r.same(a)
	vb, okb := r.same(b)
	return oka == okb && va == vb
}

// ranAgain reports whether b (an answer after a, same key) is a second
// execution, and whether that can be told at all: by the count's delta
// (want is what one execution gives), the --same values, the bodies.
func (r *runner) ranAgain(a, b response, c counter, d, want int64) (again, known bool) {
	switch {
	case c.ok:
		return d > want, true
	case b.replayed(r.cfg.ReplayHeader):
		return false, true
	}
	va, oka := r.same(a)
	vb, okb := r.same(b)
	if oka && okb {
		return va != vb, true
	}
	if !bytes.Equal(a.body, b.body) || a.status != b.status {
		return true, true
	}
	return false, false
}

// checkRetryAfter says what is wrong with a 409's Retry-After, or "".
func checkRetryAfter(a response) string {
	v := a.header.Get("Retry-After")
	if v == "" {
		return "409 without Retry-After: a client cannot tell when to retry"
	}
	if _, ok := retryAfter(a.header); !ok {
		return fmt.Sprintf("409 with Retry-After %q, neither seconds nor an HTTP date", cut(v, 40))
	}
	return ""
}

// replay: a retry after completion is the first answer again, marked.
func (r *runner) checkReplay(ctx context.Context) (Result, string) {
	cnt, err := r.startCount(ctx)
	if err != nil {
		return Fail, err.Error()
	}
	key := newKey("replay")
	q := request{key: key, body: r.cfg.Body}
	first, _ := r.answered(ctx, q)
	r.latency = first.at.Sub(first.sent)
	if !first.ok() {
		r.gate = "the endpoint did not answer the first request with a 2xx"
		return Fail, fmt.Sprintf("key %s: the first request got %s; every other check needs a 2xx (check the URL, --method, --body and -H)", key, r.describe(first))
	}
	if _, ok := r.same(first); r.cfg.Same != "" && !ok {
		r.gate = "--same names no value of the answer"
		return Fail, fmt.Sprintf("key %s: --same %s names nothing in the answer %s", key, r.cfg.Same, r.describe(first))
	}
	retry, conflicts := r.answered(ctx, q)
	d, cev, err := cnt.delta(ctx)
	if err != nil {
		return Fail, err.Error()
	}
	var bad []string
	switch {
	case retry.err != nil:
		bad = append(bad, "got "+r.describe(retry))
	case retry.status != first.status:
		bad = append(bad, fmt.Sprintf("got status %d, the first %d", retry.status, first.status))
	case !bytes.Equal(retry.body, first.body):
		bad = append(bad, fmt.Sprintf("got body %s, the first %s", r.excerpt(retry.body), r.excerpt(first.body)))
	case !r.sameAnswer(first, retry):
		bad = append(bad, fmt.Sprintf("got another %s", r.cfg.Same))
	}
	if cnt.ok && d != 1 {
		bad = append(bad, fmt.Sprintf("%d executions for one key%s", d, cev))
	}
	if len(bad) > 0 {
		return Fail, fmt.Sprintf("key %s: the retry after completion %s", key, strings.Join(bad, "; "))
	}
	ev := fmt.Sprintf("key %s: the retry got %d with a byte-identical body", key, retry.status)
	if conflicts > 0 {
		ev += fmt.Sprintf(" (after %d× 409)", conflicts)
	}
	ev += cev
	if !retry.replayed(r.cfg.ReplayHeader) {
		return Warn, ev + fmt.Sprintf("; no %s: true marker, so a client cannot tell a replay from a run", r.cfg.ReplayHeader) + r.noEvidence()
	}
	return Pass, ev + ", " + r.cfg.ReplayHeader + ": true" + r.noEvidence()
}

// storm: Requests requests with one key at once run it once.
func (r *runner) checkStorm(ctx context.Context) (Result, string) {
	cnt, err := r.startCount(ctx)
	if err != nil {
		return Fail, err.Error()
	}
	key := newKey("storm")
	q := request{key: key, body: r.cfg.Body}
	n := r.cfg.Requests
	for range n { // the whole storm's budget first, then all at once
		if err := r.take(ctx); err != nil {
			return Fail, err.Error()
		}
	}
	answers := make([]response, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range answers {
		wg.Go(func() {
			<-start
			answers[i] = r.send(ctx, q)
		})
	}
	close(start)
	wg.Wait()
	final, _ := r.answered(ctx, q) // the stored answer, once every run ended
	d, cev, err := cnt.delta(ctx)
	if err != nil {
		return Fail, err.Error()
	}

	var bad []string
	conflicts, replays := 0, 0
	var distinct []response
	for _, a := range append(answers, final) {
		switch {
		case a.err != nil:
			bad = append(bad, "a request got "+r.describe(a))
			continue
		case a.inFlight():
			conflicts++
			if why := checkRetryAfter(a); why != "" {
				bad = append(bad, why)
			}
			continue
		case a.status >= 500:
			bad = append(bad, "a request got "+r.describe(a))
		}
		if a.replayed(r.cfg.ReplayHeader) {
			replays++
		}
		known := false
		for _, o := range distinct {
			known = known || r.sameAnswer(o, a)
		}
		if !known {
			distinct = append(distinct, a)
		}
	}
	if len(distinct) > 1 {
		var ds []string
		for _, a := range distinct[:min(len(distinct), 3)] {
			ds = append(ds, r.describe(a))
		}
		bad = append(bad, fmt.Sprintf("%d different answers where one run's answer was due: %s", len(distinct), strings.Join(ds, ", ")))
	}
	if cnt.ok && d != 1 {
		bad = append(bad, fmt.Sprintf("%d executions%s", d, cev))
	}
	if len(distinct) == 0 {
		bad = append(bad, "no request got an answer")
	}
	if len(bad) > 0 {
		return Fail, fmt.Sprintf("%d at once with key %s: %s", n, key, strings.Join(dedupe(bad), "; "))
	}
	return Pass, fmt.Sprintf("%d at once with key %s: one answer %s for all%s, %d× 409 with Retry-After, %d marked replayed%s",
		n, key, r.describe(distinct[0]), cev, conflicts, replays, r.noEvidence())
}

// checkInFlight: retries sent while the first request runs are refused
// with 409 and a Retry-After, or wait and get the replay.
func (r *runner) checkInFlight(ctx context.Context) (Result, string) {
	cnt, err := r.startCount(ctx)
	if err != nil {
		return Fail, err.Error()
	}
	key := newKey("in flight")
	q := request{key: key, body: r.cfg.Body}
	wrote := make(chan struct{})
	var once sync.Once
	tctx := httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteRequest: func(httptrace.WroteRequestInfo) { once.Do(func() { close(wrote) }) },
	})
	firstc := make(chan response, 1)
	go func() { firstc <- r.do(tctx, q) }()
	var (
		first  response
		done   bool
		follow []response
	)
	select {
	case <-wrote:
	case first = <-firstc:
		done = true
	}
	for len(follow) < 5 && !done {
		select {
		case first = <-firstc:
			done = true
			continue
		default:
		}
		follow = append(follow, r.do(ctx, q))
	}
	if !done {
		first = <-firstc
	}
	// Which of them ran is the server's choice (a retry may overtake the
	// first on the way): the stored answer is the reference.
	final, _ := r.answered(ctx, q)
	d, cev, err := cnt.delta(ctx)
	if err != nil {
		return Fail, err.Error()
	}
	if !final.ok() {
		return Fail, fmt.Sprintf("key %s: after the retries, the request got %s", key, r.describe(final))
	}
	var bad []string
	overlapped, conflicts := 0, 0
	for i, a := range append([]response{first}, follow...) {
		if i > 0 && a.sent.Before(first.at) || first.inFlight() {
			overlapped++
		}
		switch {
		case a.inFlight():
			conflicts++
			if why := checkRetryAfter(a); why != "" {
				bad = append(bad, why)
			}
		case !r.sameAnswer(final, a):
			bad = append(bad, fmt.Sprintf("a request while another ran got %s, the stored answer is %s", r.describe(a), r.describe(final)))
		}
	}
	if cnt.ok && d != 1 {
		bad = append(bad, fmt.Sprintf("%d executions%s", d, cev))
	}
	if len(bad) > 0 {
		return Fail, fmt.Sprintf("key %s: %s", key, strings.Join(dedupe(bad), "; "))
	}
	if overlapped == 0 {
		return Skip, fmt.Sprintf("key %s: the first request was answered in %v, before a retry could overlap it; nothing was in flight to check (a slower endpoint shows it)",
			key, first.at.Sub(first.sent).Round(time.Millisecond))
	}
	return Pass, fmt.Sprintf("key %s: %d requests while one ran: %d× 409 with Retry-After, %d got the stored answer %s%s",
		key, len(follow)+1, conflicts, len(follow)+1-conflicts, r.describe(final), cev)
}

// mismatchBody is the other body of the mismatch check, nil if none can be
// made.
func (r *runner) mismatchBody() []byte {
	if r.cfg.MismatchBody != nil {
		return r.cfg.MismatchBody
	}
	b := bytes.TrimSpace(r.cfg.Body)
	if len(b) < 2 || b[0] != '{' {
		return nil
	}
	member := fmt.Sprintf(`"idem_verify_mismatch":%q`, newKey("mismatch"))
	rest := bytes.TrimSpace(b[1:])
	if len(rest) > 0 && rest[0] != '}' {
		member += ","
	}
	return append([]byte("{"+member), rest...)
}

// checkMismatch: the same key with another body is refused, runs nothing
// and leaves the first answer's record as it was.
func (r *runner) checkMismatch(ctx context.Context) (Result, string) {
	other := r.mismatchBody()
	if other == nil {
		return Skip, "the body is not a JSON object to add a member to: give --mismatch-body"
	}
	cnt, err := r.startCount(ctx)
	if err != nil {
		return Fail, err.Error()
	}
	key := newKey("mismatch")
	first, _ := r.answered(ctx, request{key: key, body: r.cfg.Body})
	if !first.ok() {
		return Fail, fmt.Sprintf("key %s: the first request got %s", key, r.describe(first))
	}
	mis := r.do(ctx, request{key: key, body: other})
	again, _ := r.answered(ctx, request{key: key, body: r.cfg.Body})
	d, cev, err := cnt.delta(ctx)
	if err != nil {
		return Fail, err.Error()
	}
	want := r.cfg.MismatchStatus
	var bad []string
	switch {
	case mis.err != nil || mis.status >= 500:
		bad = append(bad, "the other body got "+r.describe(mis))
	case mis.ok() && r.sameAnswer(first, mis):
		bad = append(bad, fmt.Sprintf("the other body got the first request's answer %s: the server does not compare requests (want %d)", r.describe(mis), want))
	case mis.ok():
		bad = append(bad, fmt.Sprintf("the other body ran: %s (want %d)", r.describe(mis), want))
	case mis.status != want:
		bad = append(bad, fmt.Sprintf("the other body got %s, want %d (--mismatch-status)", r.describe(mis), want))
	}
	if !r.sameAnswer(first, again) {
		bad = append(bad, fmt.Sprintf("then the first body got %s, first %s: the record changed", r.describe(again), r.describe(first)))
	}
	if cnt.ok && d != 1 {
		bad = append(bad, fmt.Sprintf("%d executions%s", d, cev))
	}
	if len(bad) > 0 {
		return Fail, fmt.Sprintf("key %s: %s", key, strings.Join(bad, "; "))
	}
	return Pass, fmt.Sprintf("key %s with another body: %s; the first body still gets its answer%s", key, r.describe(mis), cev)
}

// checkMissingKey: no key is 400 with RequireKey, a pass-through otherwise.
func (r *runner) checkMissingKey(ctx context.Context) (Result, string) {
	cnt, err := r.startCount(ctx)
	if err != nil {
		return Fail, err.Error()
	}
	a := r.do(ctx, request{noKey: true, body: r.cfg.Body})
	d, cev, err := cnt.delta(ctx)
	if err != nil {
		return Fail, err.Error()
	}
	refused := a.err == nil && (a.status == http.StatusBadRequest || a.status == http.StatusPreconditionRequired)
	switch {
	case a.err != nil || a.status >= 500:
		return Fail, "no key: got " + r.describe(a)
	case r.cfg.RequireKey && refused && d == 0:
		return Pass, fmt.Sprintf("no %s: %s%s", r.cfg.KeyHeader, r.describe(a), cev)
	case r.cfg.RequireKey && refused:
		return Fail, fmt.Sprintf("no %s: %s, but the operation ran%s", r.cfg.KeyHeader, r.describe(a), cev)
	case r.cfg.RequireKey:
		return Fail, fmt.Sprintf("no %s: %s, want 400 (--require-key)%s", r.cfg.KeyHeader, r.describe(a), cev)
	case a.ok() && a.replayed(r.cfg.ReplayHeader):
		return Fail, fmt.Sprintf("no %s: a replay %s for a request that had no key", r.cfg.KeyHeader, r.describe(a))
	case a.ok():
		return Pass, fmt.Sprintf("no %s: passed through, %s%s", r.cfg.KeyHeader, r.describe(a), cev)
	case refused:
		return Warn, fmt.Sprintf("no %s: %s; the endpoint requires a key: give --require-key to check it as such", r.cfg.KeyHeader, r.describe(a))
	}
	return Warn, fmt.Sprintf("no %s: %s, neither a pass-through nor 400", r.cfg.KeyHeader, r.describe(a))
}

// checkKeyLimits: a 255-byte key works; an over-long, a non-ASCII and an
// empty key are refused; no key ever runs twice.
func (r *runner) checkKeyLimits(ctx context.Context) (Result, string) {
	long := func(n int) string {
		k := newKey("limits")
		return k + strings.Repeat("x", n-len(k))
	}
	cases := []struct {
		name, key string
		refuse    bool
	}{
		{"a 255-byte key", long(255), false},
		{"a 4096-byte key", long(4096), true},
		{"a key outside printable ASCII", newKey("limits") + "-\u00e9", true},
		{"an empty key", "", true},
	}
	worst := Pass
	var ev []string
	note := func(res Result, format string, args ...any) {
		worst = worse(worst, res)
		s := fmt.Sprintf(format, args...)
		if res != Pass {
			s = string(res) + " " + s
		}
		ev = append(ev, s)
	}
	for _, c := range cases {
		cnt, err := r.startCount(ctx)
		if err != nil {
			return Fail, err.Error()
		}
		q := request{key: c.key, body: r.cfg.Body}
		a, _ := r.answered(ctx, q)
		if a.err != nil || a.status >= 500 {
			_, _, _ = cnt.delta(ctx)
			note(Fail, "%s got %s", c.name, r.describe(a))
			continue
		}
		if !a.ok() {
			d, cev, err := cnt.delta(ctx)
			switch {
			case err != nil:
				note(Fail, "%s: %v", c.name, err)
			case d != 0:
				note(Fail, "%s was refused with %d but ran%s", c.name, a.status, cev)
			case c.refuse:
				note(Pass, "%s refused (%d)", c.name, a.status)
			default:
				note(Warn, "%s refused (%d); Stripe and the IETF draft's users send keys up to 255 bytes", c.name, a.status)
			}
			continue
		}
		b, _ := r.answered(ctx, q)
		d, cev, err := cnt.delta(ctx)
		if err != nil {
			note(Fail, "%s: %v", c.name, err)
			continue
		}
		again, known := r.ranAgain(a, b, cnt, d, 1)
		switch {
		case again && c.key == "" && !r.cfg.RequireKey:
			note(Warn, "%s is taken for no key: each retry runs again%s", c.name, cev)
		case again:
			note(Fail, "%s was accepted and ran twice: %s then %s%s", c.name, r.describe(a), r.describe(b), cev)
		case !known:
			note(Warn, "%s was accepted; its retry got an identical body without a replay marker%s", c.name, r.noEvidence())
		case c.refuse:
			note(Warn, "%s was accepted (and deduplicated)%s: keys should be bounded printable ASCII", c.name, cev)
		default:
			note(Pass, "%s deduplicated%s", c.name, cev)
		}
	}
	return worst, strings.Join(ev, "; ")
}

// checkDisconnect: a request cut right after it was sent and its retry
// run the operation once in all. It cuts twice, under two keys: at once
// (the server may not have started: it must then run nothing, or record
// what it ran), and half an execution later (the server most likely
// runs it: the retry must get its answer, not a second run).
func (r *runner) checkDisconnect(ctx context.Context) (Result, string) {
	mid := min(max(r.latency/2, 10*time.Millisecond), 2*time.Second)
	worst := Pass
	var ev []string
	for _, c := range []struct {
		name string
		hold time.Duration
	}{{"cut at once", 0}, {fmt.Sprintf("cut after %v", mid.Round(time.Millisecond)), mid}} {
		res, s := r.disconnectOnce(ctx, c.hold)
		worst = worse(worst, res)
		if res != Pass {
			s = string(res) + " " + s
		}
		ev = append(ev, c.name+": "+s)
	}
	return worst, strings.Join(ev, "; ")
}

func (r *runner) disconnectOnce(ctx context.Context, hold time.Duration) (Result, string) {
	cnt, err := r.startCount(ctx)
	if err != nil {
		return Fail, err.Error()
	}
	key := newKey("disconnect")
	q := request{key: key, body: r.cfg.Body}
	if err := r.cut(ctx, q, hold); err != nil {
		return Fail, fmt.Sprintf("key %s: send the request to cut: %v", key, r.redact(err.Error()))
	}
	retry, conflicts := r.answered(ctx, q)
	if err := r.settle(ctx); err != nil {
		return Fail, err.Error()
	}
	d, cev, err := cnt.delta(ctx)
	if err != nil {
		return Fail, err.Error()
	}
	after := ""
	if conflicts > 0 {
		after = fmt.Sprintf(" after %d× 409", conflicts)
	}
	switch {
	case !retry.ok():
		return Fail, fmt.Sprintf("key %s: the retry of the cut request got %s%s", key, r.describe(retry), after)
	case cnt.ok && d > 1:
		return Fail, fmt.Sprintf("key %s: the cut request and its retry ran %d times%s; the retry got %s", key, d, cev, r.describe(retry))
	case retry.replayed(r.cfg.ReplayHeader):
		return Pass, fmt.Sprintf("key %s: the retry%s got the replay of the cut request's run%s", key, after, cev)
	case cnt.ok && d == 1:
		return Pass, fmt.Sprintf("key %s: the cut request did not run; its retry%s ran once%s", key, after, cev)
	case cnt.ok:
		return Warn, fmt.Sprintf("key %s: the retry got %s but the count did not move%s", key, r.describe(retry), cev)
	}
	return Warn, fmt.Sprintf("key %s: the retry%s ran (%s, no replay marker): without --count-url it cannot be told whether the cut request ran too", key, after, r.describe(retry))
}

// checkScope: principal B never gets principal A's answer for A's key.
func (r *runner) checkScope(ctx context.Context) (Result, string) {
	if len(r.cfg.PrincipalA) == 0 {
		return Skip, "give --principal-a and --principal-b (the headers of two principals) to check"
	}
	cnt, err := r.startCount(ctx)
	if err != nil {
		return Fail, err.Error()
	}
	key := newKey("scope")
	a, _ := r.answered(ctx, request{key: key, body: r.cfg.Body, header: r.cfg.PrincipalA})
	if !a.ok() {
		return Fail, fmt.Sprintf("key %s: A's request got %s", key, r.describe(a))
	}
	b, _ := r.answered(ctx, request{key: key, body: r.cfg.Body, header: r.cfg.PrincipalB})
	d, cev, err := cnt.delta(ctx)
	if err != nil {
		return Fail, err.Error()
	}
	switch {
	case b.err != nil || b.status >= 500:
		return Fail, fmt.Sprintf("key %s: B's request got %s", key, r.describe(b))
	case b.status == http.StatusUnauthorized || b.status == http.StatusForbidden:
		return Warn, fmt.Sprintf("key %s: B's headers were refused (%d): give a principal allowed to call the endpoint", key, b.status)
	case b.status == http.StatusConflict || b.status == r.cfg.MismatchStatus:
		return Warn, fmt.Sprintf("key %s: B got %s: B does not see A's answer, but keys are shared between principals (one can block another's key)", key, r.describe(b))
	case !b.ok():
		return Pass, fmt.Sprintf("key %s: B was refused, %s", key, r.describe(b))
	case b.replayed(r.cfg.ReplayHeader):
		return Fail, fmt.Sprintf("key %s: B got A's answer replayed: %s", key, r.describe(b))
	}
	again, known := r.ranAgain(a, b, cnt, d, 1)
	switch {
	case again:
		return Pass, fmt.Sprintf("key %s: B's request ran on its own, %s%s", key, r.describe(b), cev)
	case known:
		return Fail, fmt.Sprintf("key %s: B got A's answer %s%s", key, r.describe(b), cev)
	}
	return Warn, fmt.Sprintf("key %s: B got a body identical to A's without a replay marker%s", key, r.noEvidence())
}

// checkExpiry: once the retention passed, the key runs again.
func (r *runner) checkExpiry(ctx context.Context) (Result, string) {
	if r.cfg.TTL == 0 {
		return Skip, "give --ttl (the server's retention of a key) to check that a key runs again after it"
	}
	cnt, err := r.startCount(ctx)
	if err != nil {
		return Fail, err.Error()
	}
	key := newKey("expiry")
	q := request{key: key, body: r.cfg.Body}
	a, _ := r.answered(ctx, q)
	if !a.ok() {
		return Fail, fmt.Sprintf("key %s: the first request got %s", key, r.describe(a))
	}
	wait := r.cfg.TTL + max(time.Second, r.cfg.TTL/10)
	if err := retry.Sleep(ctx, wait); err != nil {
		return Fail, err.Error()
	}
	b, _ := r.answered(ctx, q)
	d, cev, err := cnt.delta(ctx)
	if err != nil {
		return Fail, err.Error()
	}
	if !b.ok() {
		return Fail, fmt.Sprintf("key %s: %v after the first answer, the retry got %s", key, wait, r.describe(b))
	}
	again, known := r.ranAgain(a, b, cnt, d, 1)
	switch {
	case again:
		return Pass, fmt.Sprintf("key %s: %v after the first answer (--ttl %v), it ran again: %s%s", key, wait, r.cfg.TTL, r.describe(b), cev)
	case known:
		return Fail, fmt.Sprintf("key %s: %v after the first answer (--ttl %v), still replayed: %s%s", key, wait, r.cfg.TTL, r.describe(b), cev)
	}
	return Warn, fmt.Sprintf("key %s: the retry after --ttl got an identical body without a replay marker%s", key, r.noEvidence())
}

// dedupe drops repeated lines, keeping the order and counting repeats.
func dedupe(lines []string) []string {
	n := map[string]int{}
	var out []string
	for _, l := range lines {
		if n[l] == 0 {
			out = append(out, l)
		}
		n[l]++
	}
	for i, l := range out {
		if n[l] > 1 {
			out[i] = fmt.Sprintf("%s (%d×)", l, n[l])
		}
	}
	return out
}
