package mail

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"log/slog"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

func TestPages(t *testing.T) {
	for _, tc := range []struct {
		page     Page
		status   int
		contains string
	}{
		{PageConfirm, 200, `<form id="consent" method="post">`},
		{PageDecline, 200, "I did not sign up — never email me again"},
		{PageDeclined, 200, "You will not receive any more email from Tom &amp; &lt;script&gt;"},
		{PageConfirmed, 200, "You’re subscribed"},
		{PageInvalid, 404, "no longer valid"},
		{PageUnavailable, 503, "try again"},
		{PageRateLimited, 429, "still works"},
	} {
		t.Run(tc.contains, func(t *testing.T) {
			rec := httptest.NewRecorder()
			WritePage(rec, tc.page, `Tom & <script>alert(1)</script>`)
			res := rec.Result()
			body := rec.Body.String()
			if res.StatusCode != tc.status || tc.page.Status() != tc.status {
				t.Errorf("status %d (Status() %d), want %d", res.StatusCode, tc.page.Status(), tc.status)
			}
			for h, want := range map[string]string{
				"Content-Type":            "text/html; charset=utf-8",
				"Cache-Control":           "no-store",
				"Content-Security-Policy": PageCSP,
				"X-Content-Type-Options":  "nosniff",
				"Referrer-Policy":         "no-referrer",
			} {
				if got := res.Header.Get(h); got != want {
					t.Errorf("%s = %q, want %q", h, got, want)
				}
			}
			if !strings.Contains(body, tc.contains) {
				t.Errorf("body lacks %q:\n%s", tc.contains, body)
			}
			if strings.Contains(body, "<script>alert") {
				t.Errorf("newsletter name not escaped:\n%s", body)
			}
			if !strings.Contains(body, `<meta name="viewport" content="width=device-width, initial-scale=1">`) ||
				!strings.Contains(body, `<html lang="en">`) {
				t.Error("page lacks the viewport or language")
			}
		})
	}
}

// TestPageCSPAllowsExactlyTheOwnCode checks that the pages carry no inline script at all (only
// the service's own script, allowed by script-src 'self'), that the style's hash in the policy
// is that of the style the page carries, and the parts of docs/api-contract.md §12.1: the
// nonce on the button only, an empty intent field, the unchecked noscript checkbox.
func TestPageCSPAllowsExactlyTheOwnCode(t *testing.T) {
	for _, page := range []Page{PageConfirm, PageDecline} {
		rec := httptest.NewRecorder()
		WritePageData(rec, page, PageData{Newsletter: "Weekly", Email: "ann@example.com", Token: "T0KEN", Nonce: "123.abc"})
		body := rec.Body.String()
		hash := func(s string) string {
			sum := sha256.Sum256([]byte(s))
			return "'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"
		}
		inline := regexp.MustCompile(`(?s)<script>(.*?)</script>`).FindAllStringSubmatch(body, -1)
		style := regexp.MustCompile(`(?s)<style>(.*?)</style>`).FindAllStringSubmatch(body, -1)
		if len(inline) != 0 || len(style) != 1 || !strings.Contains(body, `<script src="/confirm.js"></script>`) {
			t.Fatalf("found %d inline scripts and %d styles, want 0 and 1 and the served script:\n%s", len(inline), len(style), body)
		}
		csp := rec.Header().Get("Content-Security-Policy")
		for _, want := range []string{
			"default-src 'none'", "script-src 'self';", "style-src " + hash(style[0][1]) + ";",
			"form-action 'self'", "frame-ancestors 'none'", "base-uri 'none'",
		} {
			if !strings.Contains(csp, want) {
				t.Errorf("CSP %q lacks %q", csp, want)
			}
		}
		if strings.Contains(csp, "unsafe-inline") || strings.Contains(body, " style=") ||
			regexp.MustCompile(` on[a-z]+=`).MatchString(body) {
			t.Error("page relies on inline attributes the policy forbids")
		}
		for _, want := range []string{`<input type="hidden" name="intent" value="">`, `data-nonce="123.abc"`,
			`<noscript><p class="consent"><label><input type="checkbox" name="consent" value="yes">`, "ann@example.com"} {
			if !strings.Contains(body, want) {
				t.Errorf("page lacks %q:\n%s", want, body)
			}
		}
		if strings.Count(body, "123.abc") != 1 || strings.Contains(body, "action=") || strings.Contains(body, " checked") {
			t.Errorf("the nonce is not on the button only, or the form posts elsewhere, or the box is checked:\n%s", body)
		}
	}
	// The script submits nothing by itself: it only reacts to a trusted click.
	if strings.Contains(PageScript, "submit(") || !strings.Contains(PageScript, "event.isTrusted") {
		t.Errorf("the page script submits by itself or ignores isTrusted:\n%s", PageScript)
	}
}

// TestLogTransportShowsLinkKeepsAddressAtDebug: without SMTP the log is the only place the
// link exists, so it is logged at info; the full address and the text only at debug. Out, when
// set, gets the address and link ready to click.
func TestLogTransportShowsLinkKeepsAddressAtDebug(t *testing.T) {
	m := composeTest(t)
	for _, tc := range []struct {
		level       slog.Level
		wantAddress bool
	}{{slog.LevelInfo, false}, {slog.LevelDebug, true}} {
		var buf, out bytes.Buffer
		lt := LogTransport{Log: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: tc.level})), Out: &out}
		if err := lt.Send(context.Background(), m); err != nil {
			t.Fatal(err)
		}
		logged := buf.String()
		if !strings.Contains(logged, "link=https://news.example.com/confirm/T0KEN") {
			t.Errorf("level %v: no link in the log:\n%s", tc.level, logged)
		}
		if !strings.Contains(logged, m.ID) || !strings.Contains(logged, "a***@example.com") {
			t.Errorf("level %v: log lacks the message id or masked recipient:\n%s", tc.level, logged)
		}
		if got := strings.Contains(logged, "ann@example.com"); got != tc.wantAddress {
			t.Errorf("level %v: full address in log = %v, want %v", tc.level, got, tc.wantAddress)
		}
		if want := "ann@example.com (not sent: SMTP_URL is unset). Confirm with:\n  https://news.example.com/confirm/T0KEN\n"; !strings.Contains(out.String(), want) {
			t.Errorf("Out = %q, want it to contain %q", out.String(), want)
		}
	}
}
