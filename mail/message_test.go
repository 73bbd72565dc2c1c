package mail

import (
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/subscriberd/subscriberd/model"
)

func testEmail() model.OutboxEmail {
	return model.OutboxEmail{
		ID:             uuid.MustParse("0191f0a6-6b5e-7c3a-8f00-000000000001"),
		NewsletterName: "Tom & Jerry's <Weekly>",
		SubscriberID:   uuid.New(),
		Email:          "ann@example.com",
		FirstName:      "Ann",
		LastName:       "<b>Lee</b>",
		Kind:           model.EmailKindConfirmation,
	}
}

func TestNewComposer(t *testing.T) {
	for _, tc := range []struct {
		name, from, base string
		ok               bool
	}{
		{"defaults", "", "http://localhost:8080", true},
		{"named sender and https path", "News <news@example.com>", "https://example.com/sub/", true},
		{"bad sender", "not an address", "http://localhost:8080", false},
		{"two senders", "a@x.io, b@x.io", "http://localhost:8080", false},
		{"relative base", "", "/confirm", false},
		{"ftp base", "", "ftp://example.com", false},
		{"base with query", "", "https://example.com/?a=1", false},
		{"Unicode domain sender", "Café <news@bücher.example>", "http://localhost:8080", true},
		{"Unicode local part sender", "zoë@example.com", "http://localhost:8080", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewComposer(tc.from, tc.base)
			if (err == nil) != tc.ok {
				t.Errorf("NewComposer(%q, %q) error = %v, want ok=%v", tc.from, tc.base, err, tc.ok)
			}
		})
	}
}

func TestCompose(t *testing.T) {
	c, err := NewComposer("", "https://news.example.com/")
	if err != nil {
		t.Fatal(err)
	}
	tok, _ := NewToken()
	m, err := c.Compose(testEmail(), tok)
	if err != nil {
		t.Fatal(err)
	}
	link := "https://news.example.com/confirm/" + tok
	checks := []struct {
		name      string
		got, want string
	}{
		{"subject", m.Subject, "Confirm your subscription to Tom & Jerry's <Weekly>"},
		{"from", m.From.String(), `"Newsletter" <no-reply@localhost>`},
		{"to address", m.To.Address, "ann@example.com"},
		{"to name", m.To.Name, "Ann <b>Lee</b>"},
		{"message id", m.ID, "0191f0a6-6b5e-7c3a-8f00-000000000001@localhost"},
		{"link", m.Link, link},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %q, want %q", c.name, c.got, c.want)
		}
	}
	if !strings.Contains(m.Text, link) || !strings.Contains(m.Text, "Hello Ann <b>Lee</b>,") ||
		!strings.Contains(m.Text, `"Tom & Jerry's <Weekly>"`) {
		t.Errorf("text part lacks the link, greeting or newsletter:\n%s", m.Text)
	}
	if !strings.Contains(m.HTML, `href="`+link+`"`) {
		t.Errorf("html part lacks the link:\n%s", m.HTML)
	}
	for _, raw := range []string{"<b>Lee</b>", "<Weekly>", "Tom & Jerry"} {
		if strings.Contains(m.HTML, raw) {
			t.Errorf("html part contains %q unescaped", raw)
		}
	}
	if !strings.Contains(m.HTML, "Tom &amp; Jerry&#39;s &lt;Weekly&gt;") || !strings.Contains(m.HTML, "Ann &lt;b&gt;Lee&lt;/b&gt;") {
		t.Errorf("html part lacks the escaped names:\n%s", m.HTML)
	}

	// Same outbox row, new token: same Message-ID (receivers dedupe retries), new link.
	tok2, _ := NewToken()
	m2, _ := c.Compose(testEmail(), tok2)
	if m2.ID != m.ID || m2.Link == m.Link {
		t.Errorf("second attempt: id %q link %q; want id %q and a new link", m2.ID, m2.Link, m.ID)
	}
}

func TestComposeNoNameAndControlCharacters(t *testing.T) {
	c, _ := NewComposer("News <news@example.com>", "http://localhost:8080")
	e := testEmail()
	e.FirstName, e.LastName = "", ""
	e.NewsletterName = "Daily\r\nBcc: victim@example.com"
	m, err := c.Compose(e, "tok")
	if err != nil {
		t.Fatal(err)
	}
	if strings.ContainsAny(m.Subject, "\r\n") {
		t.Errorf("subject %q has a line break", m.Subject)
	}
	if !strings.HasPrefix(m.Text, "Hello,\n") {
		t.Errorf("text greeting without a name: %q", m.Text[:20])
	}
	if m.ID != e.ID.String()+"@example.com" {
		t.Errorf("message id %q, want the sender's domain", m.ID)
	}
}

// TestComposeDropsFormatAndBidiCharacters: a name stored before the API refused them (or
// written to the database some other way) cannot put a direction override or an invisible
// character into the To: header, the subject or the greeting.
func TestComposeDropsFormatAndBidiCharacters(t *testing.T) {
	c, _ := NewComposer("News <news@example.com>", "http://localhost:8080")
	e := testEmail()
	e.FirstName, e.LastName = "\u202eAnn\u200b", "Lee\u2066x\u2069\u200f"
	e.NewsletterName = "Daily\u202a News\u202c"
	m, err := c.Compose(e, "tok")
	if err != nil {
		t.Fatal(err)
	}
	if m.To.Name != "Ann Leex" {
		t.Errorf("To name %q; want %q", m.To.Name, "Ann Leex")
	}
	if m.Subject != "Confirm your subscription to Daily News" {
		t.Errorf("subject %q", m.Subject)
	}
	for part, v := range map[string]string{"to": m.To.String(), "subject": m.Subject, "text": m.Text, "html": m.HTML} {
		if strings.ContainsAny(v, "\u202e\u200b\u2066\u2069\u200f\u202a\u202c") {
			t.Errorf("%s %q holds a format or bidi character", part, v)
		}
	}
}
