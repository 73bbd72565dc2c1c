package limits

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParseWindows(t *testing.T) {
	tests := []struct {
		name, value string
		want        []Window
		wantErr     string
	}{
		{name: "default", value: DefaultRateLimits, want: []Window{{60, time.Minute}, {500, time.Hour}, {3000, 24 * time.Hour}}},
		{name: "bulk default", value: DefaultBulkRateLimits, want: []Window{{10, time.Minute}, {100, time.Hour}, {500, 24 * time.Hour}}},
		{name: "off", value: "off"},
		{name: "OFF with spaces", value: " OFF "},
		{name: "one window, days, spaces", value: " 5 / 1d ", want: []Window{{5, 24 * time.Hour}}},
		{name: "empty", value: "", wantErr: "RATE_LIMITS: empty"},
		{name: "no slash", value: "60", wantErr: `RATE_LIMITS: "60": no /`},
		{name: "zero count", value: "0/1m", wantErr: "not a whole number ≥ 1"},
		{name: "negative count", value: "-1/1m", wantErr: "not a whole number ≥ 1"},
		{name: "bad duration", value: "60/1x", wantErr: `duration "1x"`},
		{name: "zero duration", value: "60/0s", wantErr: `duration "0s"`},
		{name: "empty item", value: "60/1m,", wantErr: `RATE_LIMITS: "": no /`},
		{name: "duplicate period", value: "60/1m,10/60s", wantErr: "two windows of 1m0s"},
		{name: "too fast", value: "2000000/1s", wantErr: "more than one request per microsecond"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseWindows("RATE_LIMITS", tt.value)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.HasPrefix(err.Error(), "RATE_LIMITS: ") {
					t.Fatalf("ParseWindows(%q) error = %v, want one naming RATE_LIMITS containing %q", tt.value, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseWindows(%q): %v", tt.value, err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ParseWindows(%q) = %v, want %v", tt.value, got, tt.want)
			}
		})
	}
}

func TestParseLockout(t *testing.T) {
	tests := []struct {
		value   string
		want    Lockout
		wantErr string
	}{
		{value: DefaultAuthLockout, want: Lockout{10, 10 * time.Minute, 15 * time.Minute}},
		{value: DefaultWriteLockout, want: Lockout{30, 10 * time.Minute, 10 * time.Minute}},
		{value: "off", want: Lockout{}},
		{value: "3/90s:1h30m", want: Lockout{3, 90 * time.Second, 90 * time.Minute}},
		{value: "10/10m", wantErr: "no :lock time"},
		{value: "10/10m:", wantErr: `duration ""`},
		{value: "x/10m:1m", wantErr: "not a whole number"},
		{value: "10:1m", wantErr: "no /"},
		{value: "", wantErr: "no :lock time"},
		{value: "10001/10m:1m", wantErr: "more than 10000 failures"},
		{value: "10000/10m:1m", want: Lockout{10000, 10 * time.Minute, time.Minute}},
	}
	for _, tt := range tests {
		t.Run(tt.value, func(t *testing.T) {
			got, err := ParseLockout("AUTH_LOCKOUT", tt.value)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.HasPrefix(err.Error(), "AUTH_LOCKOUT: ") {
					t.Fatalf("ParseLockout(%q) error = %v, want one naming AUTH_LOCKOUT containing %q", tt.value, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseLockout(%q): %v", tt.value, err)
			}
			if got != tt.want {
				t.Errorf("ParseLockout(%q) = %+v, want %+v", tt.value, got, tt.want)
			}
			if got.Enabled() != (tt.value != "off") {
				t.Errorf("ParseLockout(%q).Enabled() = %v", tt.value, got.Enabled())
			}
		})
	}
}

func TestParseTrustedProxies(t *testing.T) {
	got, err := ParseTrustedProxies(" 10.0.0.0/8, 192.168.1.7 ,fd00::/8,::ffff:172.16.0.0/108,")
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Prefix{
		netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.168.1.7/32"),
		netip.MustParsePrefix("fd00::/8"), netip.MustParsePrefix("172.16.0.0/12"),
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("ParseTrustedProxies = %v, want %v", got, want)
	}
	if got, err := ParseTrustedProxies(""); err != nil || got != nil {
		t.Errorf(`ParseTrustedProxies("") = %v, %v; want nil, nil`, got, err)
	}
	if _, err := ParseTrustedProxies("10.0.0.0/33"); err == nil || !strings.HasPrefix(err.Error(), "TRUSTED_PROXIES: ") {
		t.Errorf("ParseTrustedProxies(10.0.0.0/33) error = %v, want one naming TRUSTED_PROXIES", err)
	}
}
