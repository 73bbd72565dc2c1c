package telemetry

import (
	"encoding/pem"
	"fmt"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
)

// checkExportEnv checks the OTLP exporter's and the batch processor's variables before the SDK
// reads them. The SDK, as the specification allows, ignores a value it cannot use with a line
// on stderr (or silently) and goes on with the default: an endpoint typo would send spans to
// localhost:4318, a missing CA certificate would drop TLS verification's intent, and nobody
// would know. docs/api-contract.md §7 wants invalid configuration to stop the start with one
// line naming the variable; this is that check for the variables the SDK reads itself.
// Unset and empty variables are not checked.
func checkExportEnv(getenv func(string) string) error {
	for _, signal := range []string{"", "TRACES_"} {
		pre := "OTEL_EXPORTER_OTLP_" + signal
		checks := []struct {
			name  string
			check func(string) error
		}{
			{pre + "ENDPOINT", checkEndpoint},
			{pre + "TIMEOUT", checkCount(0)},
			{pre + "HEADERS", checkHeaders},
			{pre + "COMPRESSION", checkOneOf("gzip", "none")}, // the SDK takes these exactly
			{pre + "INSECURE", checkBool},
			{pre + "CERTIFICATE", checkPEM},
			{pre + "CLIENT_CERTIFICATE", checkPEM},
			{pre + "CLIENT_KEY", checkPEM},
		}
		for _, c := range checks {
			if err := checkVar(getenv, c.name, c.check); err != nil {
				return err
			}
		}
	}
	for name, least := range map[string]int{
		"OTEL_BSP_SCHEDULE_DELAY": 0, "OTEL_BSP_EXPORT_TIMEOUT": 0,
		"OTEL_BSP_MAX_QUEUE_SIZE": 1, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": 1,
	} {
		if err := checkVar(getenv, name, checkCount(least)); err != nil {
			return err
		}
	}
	return nil
}

// checkVar runs check on the variable's value, when it has one, and names the variable and
// the value in its error.
func checkVar(getenv func(string) string, name string, check func(string) error) error {
	v := strings.TrimSpace(getenv(name))
	if v == "" {
		return nil
	}
	if err := check(v); err != nil {
		return fmt.Errorf("%s: %q %w", name, v, err)
	}
	return nil
}

func checkEndpoint(v string) error {
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("is not an http:// or https:// URL")
	}
	return nil
}

// checkCount accepts a whole number of at least least (milliseconds or a size).
func checkCount(least int) func(string) error {
	return func(v string) error {
		if n, err := strconv.Atoi(v); err != nil || n < least {
			return fmt.Errorf("is not a whole number of at least %d", least)
		}
		return nil
	}
}

func checkOneOf(values ...string) func(string) error {
	return func(v string) error {
		if slices.Contains(values, v) {
			return nil
		}
		return fmt.Errorf("is not one of %s", strings.Join(values, ", "))
	}
}

func checkBool(v string) error {
	if !strings.EqualFold(v, "true") && !strings.EqualFold(v, "false") {
		return fmt.Errorf("is not true or false")
	}
	return nil
}

// checkHeaders accepts the specification's format: key=value pairs separated by commas, each
// key and value percent-encoded.
func checkHeaders(v string) error {
	for _, pair := range strings.Split(v, ",") {
		key, value, ok := strings.Cut(pair, "=")
		if strings.TrimSpace(pair) == "" {
			continue
		}
		if !ok || strings.TrimSpace(key) == "" {
			return fmt.Errorf("is not a list of key=value pairs separated by commas")
		}
		if _, err := url.PathUnescape(key); err != nil {
			return fmt.Errorf("has a key that is not percent-encoded properly")
		}
		if _, err := url.PathUnescape(value); err != nil {
			return fmt.Errorf("has a value that is not percent-encoded properly")
		}
	}
	return nil
}

// checkPEM accepts a readable file that holds PEM data: a certificate or a key. The SDK logs
// an unusable one and goes on without it.
func checkPEM(v string) error {
	b, err := os.ReadFile(v)
	if err != nil {
		return fmt.Errorf("cannot be read: %w", err)
	}
	if block, _ := pem.Decode(b); block == nil {
		return fmt.Errorf("holds no PEM data")
	}
	return nil
}
