package notify

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Email send results, the result label of notifier_emails_total.
const (
	ResultSent      = "sent"
	ResultTransient = "transient_error" // retried with backoff
	ResultUnknown   = "unknown"         // outcome lost: connection dropped after DATA, or a sender died mid-send
	ResultFailed    = "failed"          // parked: permanent refusal or attempts exhausted
)

// Metrics are the notifier's Prometheus collectors (O1). The inbox
// registers its own (inbox_*).
type Metrics struct {
	// Emails counts send attempts by result (notifier_emails_total).
	Emails *prometheus.CounterVec
	// Resends counts sends of rows whose previous outcome was unknown, under
	// the resend policy (notifier_email_resends_total).
	Resends prometheus.Counter
	// Ledger is the number of ledger rows by state; unknown rows under the
	// hold policy wait here for an operator (notifier_email_ledger_rows).
	Ledger *prometheus.GaugeVec
	// UnknownPolicy is 1 for the configured EMAIL_UNKNOWN_POLICY
	// (notifier_email_unknown_policy).
	UnknownPolicy *prometheus.GaugeVec
	// ParkedRecords is the number of poison records parked (C6)
	// (notifier_parked_records).
	ParkedRecords prometheus.Gauge
	// ConsumeLatency is the time from the event's ce_time to its business
	// change being committed (notifier_consume_latency_seconds).
	ConsumeLatency *prometheus.HistogramVec
	// ConsumerLag is, per partition, how many records the broker holds
	// beyond the last one this instance fetched (notifier_consumer_lag).
	ConsumerLag *prometheus.GaugeVec
	// ConsumeErrors counts failed attempts to process a record; each is
	// retried (notifier_consume_errors_total).
	ConsumeErrors prometheus.Counter
}

// NewMetrics creates and registers the notifier's metrics.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		Emails: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "notifier_emails_total",
			Help: "Email send attempts by result: sent, transient_error, unknown, failed.",
		}, []string{"result"}),
		Resends: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "notifier_email_resends_total",
			Help: "Emails sent again, with the same Message-ID, after an unknown outcome (resend policy).",
		}),
		Ledger: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "notifier_email_ledger_rows",
			Help: "Send ledger rows by state.",
		}, []string{"state"}),
		UnknownPolicy: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "notifier_email_unknown_policy",
			Help: "1 for the configured policy for emails whose outcome is unknown (hold or resend).",
		}, []string{"policy"}),
		ParkedRecords: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "notifier_parked_records",
			Help: "Records parked because they could not be decoded or have an unsupported schema version.",
		}),
		ConsumeLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "notifier_consume_latency_seconds",
			Help:    "Time from the event's ce_time (producer commit) to the notifier applying it.",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600},
		}, []string{"event_type"}),
		ConsumerLag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "notifier_consumer_lag",
			Help: "Records on the broker beyond the last one fetched, per partition.",
		}, []string{"topic", "partition"}),
		ConsumeErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "notifier_consume_errors_total",
			Help: "Failed attempts to process a record (each is retried).",
		}),
	}
	for _, c := range []prometheus.Collector{m.Emails, m.Resends, m.Ledger, m.UnknownPolicy, m.ParkedRecords, m.ConsumeLatency, m.ConsumerLag, m.ConsumeErrors} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register notifier metrics: %w", err)
		}
	}
	for _, r := range []string{ResultSent, ResultTransient, ResultUnknown, ResultFailed} {
		m.Emails.WithLabelValues(r)
	}
	for _, s := range []string{StatePending, StateSending, StateSent, StateUnknown, StateFailed} {
		m.Ledger.WithLabelValues(s)
	}
	return m, nil
}
