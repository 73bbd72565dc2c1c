// Package mail delivers the double-opt-in confirmation emails of subscriberd and renders the
// confirmation pages their links open.
//
// The pieces, from the outbox row to the inbox:
//   - [Worker] claims due rows of the transactional outbox through the [Outbox] interface it
//     declares (the repo package implements it), creates a fresh confirmation token per attempt
//     (see [NewToken]: only its hash is stored), writes the email with a [Composer] and hands
//     it to a [Transport], then records the outcome: sent, retried with exponential back-off and
//     jitter, failed for good (a refused recipient suppresses the address, see [Bouncer]), or
//     cancelled when the subscriber is no longer pending or, at the last check before sending,
//     the address is suppressed.
//   - [SMTP] is the real transport (go-mail, configured by an smtp:// or smtps:// URL);
//     [LogTransport] writes emails to the log when no SMTP server is configured.
//   - [WritePage] renders the small HTML pages served at /confirm/<token> and its decline page;
//     [Nonces] makes and checks their nonces, the proof that a person pressed the button.
//
// The package imports only model and outbox (the loop, jitter and trace link the webhook
// worker shares) from the project; storage and HTTP routing live elsewhere.
package mail
