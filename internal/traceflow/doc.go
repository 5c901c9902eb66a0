// Package traceflow holds the in-process test that one trace runs from
// POST /orders to the customer's email (L4): the orders API, its outbox
// and relay, and the notifier with its inbox, ledger and sender, wired in
// one test process against real PostgreSQL, a Kafka wire-protocol broker
// (kfake) over TCP and an in-process SMTP server, with an in-memory span
// recorder as the tracer provider. It lives in a package of its own
// because it needs both services' packages, which import nothing of each
// other. The package has no code outside its tests.
package traceflow
