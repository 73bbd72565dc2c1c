package telemetry

import "github.com/prometheus/client_golang/prometheus"

// EmailSuppressed is the email_sends_total outcome of an email dropped at the last check
// before sending: its address is suppressed (docs/api-contract.md §13).
const EmailSuppressed = "suppressed"

// Label values of suppressions_total{reason} (docs/api-contract.md §13).
var suppressionReasons = []string{"manual", "hard_bounce", "complaint", "declined", "erased"}

// Label values of confirmation_page_posts_total{page, outcome} (docs/api-contract.md §12).
const (
	PageConfirm = "confirm" // POST /confirm/<token>
	PageDecline = "decline" // POST /confirm/<token>/decline

	PageConfirmed = "confirmed" // pending → active
	PageDeclined  = "declined"  // pending → unsubscribed, address suppressed
	PageRepeated  = "repeated"  // the token already did it: the success page again
	PageRefused   = "refused"   // no valid intent nor consent: nothing changed (a scanner, or a form sent as it is)
	PageInvalid   = "invalid"   // unknown, expired or superseded token: 404
)

var (
	pageKinds    = []string{PageConfirm, PageDecline}
	pageOutcomes = []string{PageConfirmed, PageDeclined, PageRepeated, PageRefused, PageInvalid}
)

// consentMetrics are the collectors of the confirm and decline pages and the suppression list.
type consentMetrics struct {
	suppressions *prometheus.CounterVec
	pagePosts    *prometheus.CounterVec
}

func (m *Metrics) registerConsent() {
	m.consent.suppressions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "suppressions_total",
		Help: "Addresses added to suppression lists, by reason (manual, hard_bounce, complaint, declined, erased).",
	}, []string{"reason"})
	m.consent.pagePosts = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "confirmation_page_posts_total",
		Help: "POSTs to the confirm and decline pages, by page (confirm, decline) and outcome (confirmed, declined, repeated, refused, invalid). Many refused: a mail scanner submits the forms.",
	}, []string{"page", "outcome"})
	for _, r := range suppressionReasons {
		m.consent.suppressions.WithLabelValues(r)
	}
	for _, p := range pageKinds {
		for _, o := range pageOutcomes {
			m.consent.pagePosts.WithLabelValues(p, o)
		}
	}
	m.reg.MustRegister(m.consent.suppressions, m.consent.pagePosts)
}

// SuppressionsCreated counts n new suppression list entries with reason.
func (m *Metrics) SuppressionsCreated(reason string, n int) {
	m.consent.suppressions.WithLabelValues(bounded(reason, suppressionReasons)).Add(float64(n))
}

// PagePost counts one POST to the confirm or decline page with its outcome.
func (m *Metrics) PagePost(page, outcome string) {
	m.consent.pagePosts.WithLabelValues(bounded(page, pageKinds), bounded(outcome, pageOutcomes)).Inc()
}
