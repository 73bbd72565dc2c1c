package webhook

import (
	"errors"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

// Sign returns the webhook-signature header value of a delivery (docs/api-contract.md §10.4),
// as the Standard Webhooks reference library computes it: "v1," and the base64 HMAC-SHA256 of
// "<id>.<timestamp>.<body>", keyed with the bytes the secret ("whsec_" + base64) encodes.
func Sign(secret, id string, timestamp int64, body []byte) (string, error) {
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		return "", errors.New("webhook secret is not base64") // never the secret itself
	}
	return wh.Sign(id, time.Unix(timestamp, 0), body)
}
