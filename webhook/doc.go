// Package webhook delivers subscriber events to the newsletters' webhook endpoints
// (docs/api-contract.md §10.4), signed as Standard Webhooks 1.0 prescribes.
//
// The pieces, from the outbox row to the receiver:
//   - [Worker] claims endpoints with due deliveries through the [Queue] interface it declares
//     (the repo package implements it): one worker at a time per endpoint, endpoints in
//     round-robin order, at most Workers endpoints at once. It posts each event with [Sign]'s
//     signature through a client that follows no redirect, bounds every attempt and the answer
//     it reads, and dials only public addresses ([Guard]); then it records the outcome:
//     delivered, retried after the back-off step less up to a quarter (or after the receiver's
//     Retry-After),
//     failed for good, and the endpoint disabled on 410 or after 5 days of failures.
//   - [Guard] is the SSRF rule: it checks a URL when an endpoint is made and, through the
//     dialer, the address actually dialled at every delivery.
//
// The package imports only model and outbox (the loop, jitter and trace link it shares with
// the email worker) from the project; storage and HTTP routing live elsewhere.
package webhook
