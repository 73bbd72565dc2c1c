package webhook

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/subscriberd/subscriberd/model"
)

// TestSign pins the wire format of docs/api-contract.md §10.4 with the Standard Webhooks
// specification's own example (checked independently with openssl dgst -hmac), and checks that
// the reference library's verifier accepts our headers and refuses a changed body.
func TestSign(t *testing.T) {
	const (
		secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
		id     = "msg_p5jXN8AQM9LWM0D4loKWxJek"
		ts     = 1614265330
		body   = `{"test": 2432232314}`
		want   = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
	)
	sig, err := Sign(secret, id, ts, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if sig != want {
		t.Errorf("Sign = %q, want %q", sig, want)
	}

	// A fresh secret and timestamp, verified as a receiver would.
	secret2 := model.NewWebhookSecret()
	id2, now := "01900000-0000-7000-8000-000000000001", time.Now().Unix()
	payload := []byte(`{"id":"01900000-0000-7000-8000-000000000001","type":"subscriber.created"}`)
	sig, err = Sign(secret2, id2, now, payload)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := standardwebhooks.NewWebhook(secret2)
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{}
	h.Set(standardwebhooks.HeaderWebhookID, id2)
	h.Set(standardwebhooks.HeaderWebhookTimestamp, strconv.FormatInt(now, 10))
	h.Set(standardwebhooks.HeaderWebhookSignature, sig)
	if err := ref.Verify(payload, h); err != nil {
		t.Errorf("reference library refuses our signature: %v", err)
	}
	if err := ref.Verify(append(payload, ' '), h); err == nil {
		t.Error("reference library accepts a changed body")
	}

	// A secret that is not base64 is refused without being repeated.
	bad := "whsec_not*base64"
	if _, err := Sign(bad, id, ts, []byte(body)); err == nil || strings.Contains(err.Error(), "not*base64") {
		t.Errorf("Sign(bad secret) = %v, want an error without the secret", err)
	}
}

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		in   string
		want time.Duration
	}{
		{"", 0},
		{"x", 0},
		{"-5", 0},
		{"0", time.Second},
		{"120", 2 * time.Minute},
		{"999999999", maxRetryAfter},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second},
		{now.Add(-time.Hour).Format(http.TimeFormat), time.Second},
	} {
		if got := retryAfter(c.in, now); got != c.want {
			t.Errorf("retryAfter(%q) = %v, want %v", c.in, got, c.want)
		}
	}
}

func TestGuard(t *testing.T) {
	ctx := context.Background()
	g := Guard{}
	for _, c := range []struct {
		url    string
		public bool
	}{
		{"https://93.184.215.14/x", true},
		{"https://[2606:2800:21f:cb07:6820:80da:af6b:8b2c]/", true},
		{"http://127.0.0.1:8080/", false},
		{"http://LOCALHOST/", false},
		{"http://app.localhost/", false},
		{"http://10.0.0.8/", false},
		{"http://172.31.255.255/", false},
		{"http://192.168.1.1/", false},
		{"http://169.254.169.254/", false},
		{"http://0.0.0.0/", false},
		{"http://[::]/", false},
		{"http://[::1]/", false},
		{"http://[fc00::1]/", false},
		{"http://[fe80::1%25eth0]/", false},
		{"http://[::ffff:10.0.0.1]/", false},
		{"http://224.0.0.1/", false},
		{"http://100.64.0.1/", false},
		{"http://100.100.100.200/", false},
		{"http://255.255.255.255/", false},
		{"http://0.1.2.3/", false},
		{"http://[64:ff9b::7f00:1]/", false},
		{"http://[64:ff9b::a00:1]/", false},
		{"http://[64:ff9b::5db8:d70e]/", true}, // 93.184.215.14 through NAT64
		{"http://[64:ff9b:1::1]/", false},
		// Special-purpose ranges no public receiver is on, and deprecated IPv6 forms.
		{"http://198.18.0.1/", false},
		{"http://192.0.2.10/", false},
		{"http://192.0.0.8/", false},
		{"http://[::127.0.0.1]/", false},
		{"http://[::ffff:0:7f00:1]/", false}, // IPv4-translated 127.0.0.1
		{"http://[fec0::1]/", false},
		{"http://[2002:7f00:1::1]/", false},      // 6to4 of 127.0.0.1
		{"http://[2002:5db8:d70e::1]/", true},    // 6to4 of 93.184.215.14
		{"http://[2001:0:4136:e378::1]/", false}, // Teredo
		{"http://[2001:db8::1]/", false},         // documentation
		// IPv4 in the forms the URL Standard reads and netip does not.
		{"http://127.1/", false},
		{"http://2130706433/", false},
		{"http://0x7f000001/", false},
		{"http://0x7F.1/", false},
		{"http://0177.0.0.1/", false},
		{"http://0/", false},
	} {
		err := g.CheckURL(ctx, c.url)
		if (err == nil) != c.public {
			t.Errorf("CheckURL(%s) = %v, want public %v", c.url, err, c.public)
		}
		if err := (Guard{AllowPrivate: true}).CheckURL(ctx, c.url); err != nil {
			t.Errorf("AllowPrivate: CheckURL(%s) = %v", c.url, err)
		}
	}
	// Names are looked up, so checked here without the lookup: only a number ends a refused one.
	for host, want := range map[string]bool{"hooks.example.com": false, "1x.example": false, "example.0x": true,
		"10.0.0.0x1f": true, "0xg": false, "a.1": true, "a1": false, "": false} {
		if got := endsInNumber(host); got != want {
			t.Errorf("endsInNumber(%q) = %v, want %v", host, got, want)
		}
	}
	if err := g.control("tcp4", "127.0.0.1:80", nil); err == nil {
		t.Error("control dials loopback")
	}
	if err := g.control("tcp4", "93.184.215.14:443", nil); err != nil {
		t.Errorf("control refuses a public address: %v", err)
	}
}
