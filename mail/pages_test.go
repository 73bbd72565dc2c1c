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
		{PageConfirm, 200, `<form id="confirm" method="post">`},
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

// TestPageCSPAllowsExactlyTheInlineCode checks that the hashes in the policy are those of the
// script and style the page really carries, and that the confirm page needs nothing else.
func TestPageCSPAllowsExactlyTheInlineCode(t *testing.T) {
	rec := httptest.NewRecorder()
	WritePage(rec, PageConfirm, "Weekly")
	body := rec.Body.String()
	hash := func(s string) string {
		sum := sha256.Sum256([]byte(s))
		return "'sha256-" + base64.StdEncoding.EncodeToString(sum[:]) + "'"
	}
	script := regexp.MustCompile(`(?s)<script>(.*?)</script>`).FindAllStringSubmatch(body, -1)
	style := regexp.MustCompile(`(?s)<style>(.*?)</style>`).FindAllStringSubmatch(body, -1)
	if len(script) != 1 || len(style) != 1 {
		t.Fatalf("found %d scripts and %d styles, want 1 each", len(script), len(style))
	}
	csp := rec.Header().Get("Content-Security-Policy")
	for _, want := range []string{
		"default-src 'none'", "script-src " + hash(script[0][1]) + ";", "style-src " + hash(style[0][1]) + ";",
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
	// The script submits the form it names, and the form posts back to the page's own URL.
	if !strings.Contains(script[0][1], `getElementById("confirm").submit()`) || strings.Contains(body, "action=") {
		t.Errorf("the script or form is not the auto-submitting same-URL form:\n%s", body)
	}
	if !strings.Contains(body, `<button type="submit">`) {
		t.Error("no visible button for browsers without scripts")
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
