package inbox

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the inbox's Prometheus collectors. The counters are labelled
// by event type (O1); the gauges are refreshed by RefreshStats.
type Metrics struct {
	// Duplicates counts events acknowledged without effect because their
	// event_id or version was already accounted for (inbox_duplicates_total).
	Duplicates *prometheus.CounterVec
	// Conflicts counts events that claimed an aggregate version another
	// event owns (inbox_conflicts_total).
	Conflicts *prometheus.CounterVec
	// Gaps counts events held because an earlier version was missing
	// (inbox_gaps_total).
	Gaps *prometheus.CounterVec
	// Covered counts events that arrived, or were held, after a resync
	// snapshot had placed their version: recorded and handed to Covered,
	// their state change skipped (inbox_covered_total).
	Covered *prometheus.CounterVec
	// Rejected counts events refused a place in their aggregate's sequence,
	// by reason: impostor (the source of truth owns another event at the
	// version, or none), dropped (an operator), conflict (no source could
	// say) (inbox_rejected_total). Any impostor means someone other than
	// the producer wrote to the topic: alert on it.
	Rejected *prometheus.CounterVec
	// Resyncs counts resync attempts by result: resynced, not_found,
	// stale or error (inbox_resyncs_total).
	Resyncs *prometheus.CounterVec
	// Held is the number of events currently held (inbox_held_events).
	Held prometheus.Gauge
	// Parked is the number of held events parked because a resync could
	// not place them or their change failed (inbox_parked_events).
	Parked prometheus.Gauge
	// ParkedRecords is the number of records parked because they could not
	// be decoded or processed (inbox_parked_records).
	ParkedRecords prometheus.Gauge
	// GapsOverdue is the number of aggregates whose gap outlived its window
	// and still waits for a successful resync: the alert signal
	// (inbox_gaps_overdue).
	GapsOverdue prometheus.Gauge
	// Cleaned counts processed_event markers deleted by the TTL cleanup
	// (inbox_processed_events_cleaned_total).
	Cleaned prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		Duplicates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inbox_duplicates_total",
			Help: "Events acknowledged without effect because their event_id or version was already processed.",
		}, []string{"event_type"}),
		Conflicts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inbox_conflicts_total",
			Help: "Events carrying an aggregate version already owned by a different event_id; recorded, never applied.",
		}, []string{"event_type"}),
		Gaps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inbox_gaps_total",
			Help: "Events held because an earlier version of their aggregate had not arrived.",
		}, []string{"event_type"}),
		Covered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inbox_covered_total",
			Help: "Events whose version a resync snapshot had already placed: recorded, state change skipped, own effects run.",
		}, []string{"event_type"}),
		Rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inbox_rejected_total",
			Help: "Events refused a place in their aggregate's sequence, by reason: impostor (not the source of truth's event at its version), dropped by an operator, or an unverifiable conflict.",
		}, []string{"reason"}),
		Resyncs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inbox_resyncs_total",
			Help: "Resynchronisations from the source of truth after a gap outlived its window, by result.",
		}, []string{"result"}),
		Held: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "inbox_held_events",
			Help: "Events currently held waiting for a missing earlier version.",
		}),
		Parked: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "inbox_parked_events",
			Help: "Held events parked for an operator: the source of truth could not place them (404) or rejected them, an operator dropped them, or their change failed.",
		}),
		ParkedRecords: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "inbox_parked_records",
			Help: "Records parked because they could not be decoded or processed (C6).",
		}),
		GapsOverdue: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "inbox_gaps_overdue",
			Help: "Aggregates whose gap outlived the gap window and is not resolved yet.",
		}),
		Cleaned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "inbox_processed_events_cleaned_total",
			Help: "processed_event markers deleted after their retention.",
		}),
	}
	for _, c := range []prometheus.Collector{m.Duplicates, m.Conflicts, m.Gaps, m.Covered, m.Rejected, m.Resyncs, m.Held, m.Parked, m.ParkedRecords, m.GapsOverdue, m.Cleaned} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register inbox metrics: %w", err)
		}
	}
	for _, r := range []string{ResyncOK, ResyncNotFound, ResyncStale, ResyncError} {
		m.Resyncs.WithLabelValues(r)
	}
	for _, r := range []string{RejectImpostor, RejectDropped, RejectConflict} {
		m.Rejected.WithLabelValues(r)
	}
	return m, nil
}

// InitEventTypes creates the labelled series of the known event types at
// zero, so dashboards and "did it rise?" checks see them before the first
// increment.
func (m *Metrics) InitEventTypes(types ...string) {
	for _, t := range types {
		m.Duplicates.WithLabelValues(t)
		m.Conflicts.WithLabelValues(t)
		m.Gaps.WithLabelValues(t)
		m.Covered.WithLabelValues(t)
	}
}
