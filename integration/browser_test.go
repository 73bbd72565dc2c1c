package integration

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
)

// chromiumPath finds a headless Chromium: $CHROMIUM, else chromium or chromium-browser on PATH.
func chromiumPath() string {
	if c := os.Getenv("CHROMIUM"); c != "" {
		return c
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// browser starts headless Chromium with a phone-sized window and the network off but for
// loopback, and returns a tab's context.
func browser(t *testing.T) context.Context {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: no browser")
	}
	bin := chromiumPath()
	if bin == "" {
		t.Skip("#### NO CHROMIUM: the confirm page was NOT loaded in a browser (install the Debian package " +
			"`chromium`, or set CHROMIUM) ####")
	}
	// Chromium's helper processes may still write to the profile for a moment after the
	// browser is killed, which makes t.TempDir's strict cleanup fail the test; the profile is
	// removed here, with retries, after the browser is gone (cleanups run last-in first-out).
	profile, err := os.MkdirTemp("", "subscriberd-chromium-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for i := 0; i < 50 && os.RemoveAll(profile) != nil; i++ {
			time.Sleep(100 * time.Millisecond)
		}
	})
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(bin), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.UserDataDir(profile), chromedp.WindowSize(390, 844),
		chromedp.Flag("host-resolver-rules", "MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"),
		chromedp.Flag("proxy-server", "http://127.0.0.1:9"))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(actx)
	tctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	t.Cleanup(func() { cancel(); cancelTab(); cancelAlloc() })
	var errs []string
	chromedp.ListenTarget(tctx, func(ev any) {
		if e, ok := ev.(*runtime.EventExceptionThrown); ok {
			errs = append(errs, e.ExceptionDetails.Text)
		}
	})
	t.Cleanup(func() {
		if len(errs) > 0 {
			t.Errorf("page exceptions: %v", errs)
		}
	})
	return tctx
}

// screenshot saves the page as a PNG in $SCREENSHOT_DIR (to look at), else in the test's
// temporary directory.
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	var png []byte
	if err := chromedp.Run(ctx, chromedp.FullScreenshot(&png, 100)); err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	dir := os.Getenv("SCREENSHOT_DIR")
	if dir == "" {
		dir = t.TempDir()
	}
	if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestBrowserConfirmNeedsAPerson: docs/api-contract.md §12.1 as a mail scanner and a person
// meet it. Headless Chromium loads the confirm page, runs its script and waits: still pending.
// A script on the page clicking the button (as a scanner that runs scripts would) is not a
// trusted event: still pending. A mouse click dispatched through the DevTools protocol, which
// the page sees as trusted, confirms.
func TestBrowserConfirmNeedsAPerson(t *testing.T) {
	m := newMailEnv(t)
	id, link := m.pendingWithLink("ann@example.com")
	ctx := browser(t)

	if err := chromedp.Run(ctx, chromedp.Navigate(link), chromedp.WaitVisible("button[data-nonce]"), chromedp.Sleep(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	screenshot(t, ctx, "confirm-page")
	if got := m.status(id); got != "pending" {
		t.Fatalf("after loading the page and waiting, the subscriber is %s", got)
	}
	var submitted bool
	if err := chromedp.Run(ctx,
		chromedp.Evaluate(`document.querySelector("button[data-nonce]").click(); true`, &submitted),
		chromedp.Sleep(time.Second)); err != nil {
		t.Fatal(err)
	}
	if got := m.status(id); got != "pending" {
		t.Fatalf("after a script's click, the subscriber is %s", got)
	}
	if err := chromedp.Run(ctx, chromedp.Click("button[data-nonce]", chromedp.NodeVisible)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the subscriber confirmed by the click", func() bool { return m.status(id) == "active" })
	var text string
	if err := chromedp.Run(ctx, chromedp.WaitVisible("main h1"), chromedp.Text("main", &text)); err != nil {
		t.Fatal(err)
	}
	screenshot(t, ctx, "confirmed-page")
	if !strings.Contains(text, "is confirmed") {
		t.Errorf("after the click the page says %q", text)
	}
	src := m.history(id)[2]["data"].(map[string]any)["source"].(map[string]any)
	if src["method"] != "button" {
		t.Errorf("confirmed event source %v: want method button", src)
	}
}

// TestBrowserDeclinePage: the decline page in the browser waits without acting; a person's
// click declines.
func TestBrowserDeclinePage(t *testing.T) {
	m := newMailEnv(t)
	id, link := m.pendingWithLink("bob@example.com")
	ctx := browser(t)
	if err := chromedp.Run(ctx, chromedp.Navigate(link+"/decline"), chromedp.WaitVisible("button[data-nonce]"),
		chromedp.Sleep(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	screenshot(t, ctx, "decline-page")
	if got := m.status(id); got != "pending" {
		t.Fatalf("after loading the decline page, the subscriber is %s", got)
	}
	if err := chromedp.Run(ctx, chromedp.Click("button[data-nonce]", chromedp.NodeVisible)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the subscriber declined by the click", func() bool { return m.status(id) == "unsubscribed" })
	var text string
	if err := chromedp.Run(ctx, chromedp.WaitVisible("main h1"), chromedp.Text("main", &text)); err != nil {
		t.Fatal(err)
	}
	screenshot(t, ctx, "declined-page")
	if !strings.Contains(text, "You will not receive any more email") {
		t.Errorf("after the click the page says %q", text)
	}
}
