package console_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/console"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/retry"
)

// chromiumPath finds Debian's Chromium: IDEM_CHROMIUM (.ci/run exports
// it), else chromium on the PATH. Without one the browser tests skip,
// and fail under CI.
func chromiumPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("IDEM_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("no Chromium (IDEM_CHROMIUM unset, none on the PATH); CI must run the browser tests: apt-get install chromium chromium-driver")
	}
	t.Skip("no Chromium: skipping the browser tests (apt-get install chromium chromium-driver, or set IDEM_CHROMIUM)")
	return ""
}

// browser starts one headless Chromium for the test and returns a
// function that opens a new tab (its own cookies: a new incognito-like
// browser context) with a deadline.
func browser(t *testing.T) func() context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.NoSandbox, // CI runs as root
		chromedp.DisableGPU,
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1280, 860),
	)
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	root, cancelRoot := chromedp.NewContext(alloc)
	t.Cleanup(cancelRoot)
	if err := chromedp.Do(root); err != nil { // start the browser
		t.Fatalf("start chromium: %v", err)
	}
	return func() context.Context {
		tab, cancel := chromedp.NewContext(root, chromedp.WithNewBrowserContext())
		// The first run opens the tab, which lives as long as that run's
		// context: open it without the deadline the steps get.
		if err := chromedp.Do(tab); err != nil {
			cancel()
			t.Fatalf("open a tab: %v", err)
		}
		ctx, cancelT := context.WithTimeout(tab, 30*time.Second)
		t.Cleanup(func() { cancelT(); cancel() })
		return ctx
	}
}

// shots writes screenshots to IDEM_CONSOLE_SCREENSHOTS (docs/console when
// regenerating the README's images); nothing when it is unset.
func shot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	dir := os.Getenv("IDEM_CONSOLE_SCREENSHOTS")
	if dir == "" {
		return
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		t.Fatalf("text of %s: %v", sel, err)
	}
	return s
}

func run(t *testing.T, ctx context.Context, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(ctx, steps...); err != nil {
		// Say where the browser is: the page explains most failures.
		c, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		where, _ := chromedp.Run(c, chromedp.Evaluate[string](`location.href + "\n" + document.body.innerText.slice(0, 2000)`))
		t.Fatalf("%v; the browser is at %s", err, where)
	}
}

// eval evaluates a JavaScript expression in the page.
func eval[T any](t *testing.T, ctx context.Context, js string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js))
	if err != nil {
		t.Fatalf("evaluate %s: %v", js, err)
	}
	return v
}

// TestBrowser drives the console in headless Chromium: the overview, a key
// stored by the idemhttp middleware found and its response read, a dead
// inbox row redriven and seen processed, a read-only console refusing an
// action, and a console with a token refusing the unauthenticated.
func TestBrowser(t *testing.T) {
	newTab := browser(t)

	e := newEnv(t, nil)
	storeHTTP(t, e.store, "alice", "pay-7f3a", `{"id":"ch_1","amount":4200,"currency":"eur"}`)
	storeHTTP(t, e.store, "bob", "pay-91c2", `{"id":"ch_2","amount":990,"currency":"eur"}`)
	complete(t, e.store, "billing", "invoice-2026-001", []byte("sent"))
	if _, err := e.store.Claim(t.Context(), idem.ClaimRequest{Scope: "billing", Key: "invoice-2026-002", Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
	ids := seedDead(t, e.store, 3)
	e.dlq.add(2)

	// A worker that fails until fixed: the redriven row is processed.
	var fixed atomic.Bool
	w, err := inbox.NewWorker(e.store.Inbox(), &inbox.Config{Workers: 1, PurgeInterval: -1, PollInterval: 50 * time.Millisecond,
		Retry: &retry.Policy{Base: time.Millisecond, Cap: time.Millisecond, MaxAttempts: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Handle("charge", func(context.Context, inboxTx, inbox.Message) error {
		if !fixed.Load() {
			return errors.New("card declined")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	t.Run("overview", func(t *testing.T) {
		ctx := newTab()
		run(t, ctx, chromedp.Navigate(e.srv.URL+"/"), chromedp.WaitVisible(chromedp.CSS("#records")))
		if got := text(t, ctx, "#created"); got != "4" {
			t.Errorf("records created in the last hour: %q, want 4", got)
		}
		if got := text(t, ctx, "#dead"); !strings.Contains(got, "max_attempts") {
			t.Errorf("dead letters by reason: %q", got)
		}
		bars := eval[int](t, ctx, `document.querySelectorAll("svg.chart rect").length`)
		if bars < 5 {
			t.Errorf("%d bars in the charts", bars)
		}
		shot(t, ctx, "overview")
	})

	t.Run("key search", func(t *testing.T) {
		ctx := newTab()
		run(t, ctx, chromedp.Navigate(e.srv.URL+"/keys"),
			chromedp.SendKeys(chromedp.CSS("#key"), "pay-7f3a"),
			chromedp.Click(chromedp.CSS("#search-button")),
			chromedp.WaitVisible(chromedp.CSS("#results")))
		shot(t, ctx, "keys")
		run(t, ctx, chromedp.Click(chromedp.CSS(`#results a[href^="/keys/record"]`)),
			chromedp.WaitVisible(chromedp.CSS("#response-status")))
		if got := text(t, ctx, "#response-status"); got != "201 Created" {
			t.Errorf("status %q", got)
		}
		if got := text(t, ctx, "#body"); !strings.Contains(got, `"amount":4200`) {
			t.Errorf("body %q", got)
		}
		page, err := chromedp.Run(ctx, chromedp.OuterHTML(chromedp.CSS("html")))
		if err != nil {
			t.Fatal(err)
		}
		for _, secret := range []string{"Set-Cookie", "cookie-secret", "client-secret"} {
			if strings.Contains(page, secret) {
				t.Errorf("the record page shows %q", secret)
			}
		}
		shot(t, ctx, "record")
	})

	t.Run("redrive", func(t *testing.T) {
		ctx := newTab()
		row := fmt.Sprintf("%s/inbox/row?id=%d", e.srv.URL, ids[0])
		run(t, ctx, chromedp.Navigate(e.srv.URL+"/inbox?state=dead"), chromedp.WaitVisible(chromedp.CSS("#rows")))
		shot(t, ctx, "inbox")
		run(t, ctx, chromedp.Navigate(row), chromedp.WaitVisible(chromedp.CSS("#history")))
		if got := text(t, ctx, "#row-state"); got != "dead" {
			t.Fatalf("state %q", got)
		}
		shot(t, ctx, "inbox-row")
		fixed.Store(true)
		if err := w.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { w.Stop(context.Background()) })
		run(t, ctx, chromedp.Click(chromedp.CSS("#redrive")), chromedp.WaitVisible(chromedp.CSS("#notice")))
		if got := text(t, ctx, "#notice"); !strings.Contains(got, "Redrove 1") {
			t.Errorf("notice %q", got)
		}
		// Reload until the worker has processed it.
		deadline := time.Now().Add(30 * time.Second)
		for {
			run(t, ctx, chromedp.Navigate(row), chromedp.WaitVisible(chromedp.CSS("#row-state")))
			if text(t, ctx, "#row-state") == "processed" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the redriven row was not processed")
			}
			time.Sleep(100 * time.Millisecond)
		}
		// Discard another, through its confirmation page.
		run(t, ctx, chromedp.Navigate(fmt.Sprintf("%s/inbox/row?id=%d", e.srv.URL, ids[1])),
			chromedp.Click(chromedp.CSS("#discard")), chromedp.WaitVisible(chromedp.CSS("#confirm")))
		shot(t, ctx, "confirm")
		run(t, ctx, chromedp.Click(chromedp.CSS("#confirm")), chromedp.WaitVisible(chromedp.CSS("#notice")))
		if _, _, err := e.store.Inbox().Get(t.Context(), ids[1]); !errors.Is(err, idem.ErrNotFound) {
			t.Errorf("discarded row: %v", err)
		}
	})

	t.Run("dead letters", func(t *testing.T) {
		ctx := newTab()
		run(t, ctx, chromedp.Navigate(e.srv.URL+"/dlq/list?q=0"), chromedp.WaitVisible(chromedp.CSS("#dead-letters")))
		shot(t, ctx, "dead-letters")
		run(t, ctx, chromedp.Click(chromedp.CSS(`#dead-letters a[href^="/dlq/message"]`)), chromedp.WaitVisible(chromedp.CSS("#headers")))
		shot(t, ctx, "dead-letter")
	})

	t.Run("read-only refuses", func(t *testing.T) {
		ro := newEnv(t, func(c *console.Config) { c.ReadOnly = true })
		dead := seedDead(t, ro.store, 1)
		ctx := newTab()
		run(t, ctx, chromedp.Navigate(fmt.Sprintf("%s/inbox/row?id=%d", ro.srv.URL, dead[0])), chromedp.WaitVisible(chromedp.CSS("#read-only")))
		buttons := eval[int](t, ctx, `document.querySelectorAll("#redrive, #discard").length`)
		if buttons != 0 {
			t.Fatalf("%d action buttons on a read-only console", buttons)
		}
		// Post the form anyway, as a hand-made request from the page.
		eval[bool](t, ctx, fmt.Sprintf(`(() => { const f = document.createElement("form"); f.method = "post"; f.action = "/inbox/redrive";
			const i = document.createElement("input"); i.name = "id"; i.value = "%d"; f.appendChild(i); document.body.appendChild(f); f.submit(); return true })()`, dead[0]))
		run(t, ctx, chromedp.WaitVisible(chromedp.CSS("#error")))
		if got := text(t, ctx, "#error"); !strings.Contains(got, "403") || !strings.Contains(got, "read-only") {
			t.Errorf("refusal %q", got)
		}
		if row, _, _ := ro.store.Inbox().Get(t.Context(), dead[0]); row.State != inbox.StateDead {
			t.Fatalf("a read-only console moved the row to %s", row.State)
		}
	})

	t.Run("unauthenticated refused", func(t *testing.T) {
		const token = "browser-test-token"
		sec := newEnv(t, func(c *console.Config) { c.Token = token })
		ctx := newTab()
		run(t, ctx, chromedp.Navigate(sec.srv.URL+"/inbox"), chromedp.WaitVisible(chromedp.CSS("#token")))
		if got := text(t, ctx, "h1"); got != "Log in" {
			t.Fatalf("an unauthenticated visit got %q", got)
		}
		inboxLinks := eval[int](t, ctx, `document.querySelectorAll("table, nav").length`)
		if inboxLinks != 0 {
			t.Fatal("the login page shows the console")
		}
		shot(t, ctx, "login")
		run(t, ctx, chromedp.SendKeys(chromedp.CSS("#token"), "wrong"), chromedp.Click(chromedp.CSS("#login")),
			chromedp.WaitVisible(chromedp.CSS("#error")))
		run(t, ctx, chromedp.SendKeys(chromedp.CSS("#token"), token), chromedp.Click(chromedp.CSS("#login")),
			chromedp.WaitVisible(chromedp.CSS(".tabs")))
		if got := text(t, ctx, "h1"); got != "Inbox" {
			t.Fatalf("after login: %q", got)
		}
		// The session cookie is out of the page's reach (HttpOnly).
		cookies := eval[string](t, ctx, `document.cookie`)
		if strings.Contains(cookies, "idem_console") {
			t.Fatalf("the page can read the console's cookies: %q", cookies)
		}
	})
}
