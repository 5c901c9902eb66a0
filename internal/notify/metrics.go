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
	ResultSkipped   = "skipped"         // never sent: the event was older than EMAIL_MAX_AGE before it could be
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
	// Sent and skipped are estimates (RefreshLedgerStats).
	Ledger *prometheus.GaugeVec
	// UnknownPolicy is 1 for the configured EMAIL_UNKNOWN_POLICY
	// (notifier_email_unknown_policy).
	UnknownPolicy *prometheus.GaugeVec
	// ConsumeLatency is the time from the event's ce_time to its business
	// change being committed (notifier_consume_latency_seconds).
	ConsumeLatency *prometheus.HistogramVec
	// ConsumerLag is, per partition, how many records the broker holds
	// beyond the group's committed offset, read from the broker's end
	// offsets on an interval, so it grows while nothing is fetched
	// (notifier_consumer_lag).
	ConsumerLag *prometheus.GaugeVec
	// StalledPartitions counts partitions with a lag whose committed offset
	// has not moved for the stall threshold (notifier_consumer_stalled_partitions).
	StalledPartitions prometheus.Gauge
	// Degraded is 1 while the consumer waits out an infrastructure failure
	// (the database unreachable) with its partitions paused
	// (notifier_consumer_degraded).
	Degraded prometheus.Gauge
	// PartitionsLost counts partitions taken away from this member without
	// a chance to commit, for example after it missed the rebalance timeout
	// (notifier_partitions_lost_total).
	PartitionsLost prometheus.Counter
	// ConsumeErrors counts failed attempts to process a record; each is
	// retried (notifier_consume_errors_total).
	ConsumeErrors prometheus.Counter
	// CleanupDeleted counts rows the retention cleanup deleted, by table:
	// processed_event and email_send (notifier_cleanup_deleted_total).
	CleanupDeleted *prometheus.CounterVec
}

// NewMetrics creates and registers the notifier's metrics.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		Emails: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "notifier_emails_total",
			Help: "Email outcomes by result: sent, transient_error, unknown, failed, and skipped (older than EMAIL_MAX_AGE).",
		}, []string{"result"}),
		Resends: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "notifier_email_resends_total",
			Help: "Emails sent again, with the same Message-ID, after an unknown outcome (resend policy).",
		}),
		Ledger: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "notifier_email_ledger_rows",
			Help: "Send ledger rows by state: pending, sending, unknown and failed exact; sent and skipped estimated from the planner's statistics.",
		}, []string{"state"}),
		UnknownPolicy: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "notifier_email_unknown_policy",
			Help: "1 for the configured policy for emails whose outcome is unknown (hold or resend).",
		}, []string{"policy"}),
		ConsumeLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "notifier_consume_latency_seconds",
			Help:    "Time from the event's ce_time (producer commit) to the notifier applying it.",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600},
		}, []string{"event_type"}),
		ConsumerLag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "notifier_consumer_lag",
			Help: "Records on the broker beyond the group's committed offset, per partition, from the broker's end offsets.",
		}, []string{"topic", "partition"}),
		StalledPartitions: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "notifier_consumer_stalled_partitions",
			Help: "Partitions with a lag whose committed offset has not moved for the stall threshold.",
		}),
		Degraded: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "notifier_consumer_degraded",
			Help: "1 while the consumer waits out an infrastructure failure with its partitions paused, else 0.",
		}),
		PartitionsLost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "notifier_partitions_lost_total",
			Help: "Partitions lost without a chance to commit (for example after missing the rebalance timeout).",
		}),
		ConsumeErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "notifier_consume_errors_total",
			Help: "Failed attempts to process a record (each is retried).",
		}),
		CleanupDeleted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "notifier_cleanup_deleted_total",
			Help: "Rows deleted by the retention cleanup, by table (processed_event, email_send).",
		}, []string{"table"}),
	}
	for _, c := range []prometheus.Collector{m.Emails, m.Resends, m.Ledger, m.UnknownPolicy, m.ConsumeLatency, m.ConsumerLag,
		m.StalledPartitions, m.Degraded, m.PartitionsLost, m.ConsumeErrors, m.CleanupDeleted} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register notifier metrics: %w", err)
		}
	}
	m.CleanupDeleted.WithLabelValues("processed_event")
	m.CleanupDeleted.WithLabelValues("email_send")
	for _, r := range []string{ResultSent, ResultTransient, ResultUnknown, ResultFailed, ResultSkipped} {
		m.Emails.WithLabelValues(r)
	}
	for _, s := range []string{StatePending, StateSending, StateSent, StateUnknown, StateFailed, StateSkipped} {
		m.Ledger.WithLabelValues(s)
	}
	return m, nil
}
