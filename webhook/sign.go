package webhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strconv"
	"strings"

	"github.com/subscriberd/subscriberd/model"
)

// Sign returns the webhook-signature header value of a delivery (Standard Webhooks 1.0):
// "v1," and the base64 HMAC-SHA256 of "<id>.<timestamp>.<body>", keyed with the bytes the
// secret ("whsec_" + base64) encodes.
func Sign(secret, id string, timestamp int64, body []byte) (string, error) {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, model.WebhookSecretPrefix))
	if err != nil {
		return "", errors.New("webhook secret is not base64") // never the secret itself
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id))
	mac.Write([]byte{'.'})
	mac.Write(strconv.AppendInt(nil, timestamp, 10))
	mac.Write([]byte{'.'})
	mac.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil)), nil
}
