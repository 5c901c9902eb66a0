package relay

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxref/orders/internal/outbox"
	"github.com/outboxref/orders/internal/outbox/internal/outboxdb"
)

// relayMetrics are the counters a relay updates as it works (O1). They
// are per process; the backlog gauges come from StatsCollector instead.
type relayMetrics struct {
	attempts     *prometheus.CounterVec
	published    *prometheus.CounterVec
	errors       *prometheus.CounterVec
	lostConfirms *prometheus.CounterVec
	partitions   prometheus.Gauge
	shadow       *prometheus.CounterVec
	latency      *prometheus.HistogramVec
}

func newRelayMetrics() *relayMetrics {
	return &relayMetrics{
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_publish_attempts_total",
			Help: "Records handed to the Kafka producer, by event type; re-sends count again.",
		}, []string{"event_type"}),
		published: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_published_total",
			Help: "Records acknowledged by the broker, by event type.",
		}, []string{"event_type"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_publish_errors_total",
			Help: "Failed delivery attempts by event type and error class; deterministic classes park the event.",
		}, []string{"event_type", "class"}),
		lostConfirms: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_lost_confirms_total",
			Help: "Acknowledged records whose confirm matched no row because the partition passed to another relay (fenced); its new owner re-sends them.",
		}, []string{"event_type"}),
		partitions: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "outbox_relay_partitions_owned",
			Help: "Partitions of the aggregates this relay owns and delivers; the relays share them evenly.",
		}),
		shadow: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "outbox_shadow_compared_total",
			Help: "Events in shadow publish mode compared with what the direct path sent, by event type and result (match, mismatch, missing).",
		}, []string{"event_type", "result"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "outbox_commit_to_publish_seconds",
			Help: "Time from the business commit (created_at) to the broker's acknowledgement, by event type.",
			// 5 ms (a nudged event) to about 20 minutes (a long outage).
			Buckets: prometheus.ExponentialBuckets(0.005, 2.5, 14),
		}, []string{"event_type"}),
	}
}

// allClasses lists every ErrorClass, for initTypes.
var allClasses = []ErrorClass{ClassTimeout, ClassBrokerUnavailable, ClassUnknownTopic, ClassAuth, ClassBroker, ClassShutdown,
	ClassMessageTooLarge, ClassInvalidRecord, ClassUnknownEventType, ClassUnknownSchemaVersion}

// initTypes creates every series of the known event types at zero. An
// alert on increase() of a counter only sees an increment from a series
// that existed before it; and a dashboard shows the type from the start.
func (m *relayMetrics) initTypes(types []outbox.EventType) {
	for _, t := range types {
		m.attempts.WithLabelValues(t.Name)
		m.published.WithLabelValues(t.Name)
		m.lostConfirms.WithLabelValues(t.Name)
		for _, res := range []string{ShadowMatch, ShadowMismatch, ShadowMissing} {
			m.shadow.WithLabelValues(t.Name, res)
		}
		for _, c := range allClasses {
			m.errors.WithLabelValues(t.Name, string(c))
		}
	}
}

func (m *relayMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.attempts, m.published, m.errors, m.lostConfirms, m.partitions, m.shadow, m.latency}
}

// StatsCollector reports the outbox backlog from the table (O1):
// outbox_pending_events, outbox_oldest_pending_age_seconds,
// outbox_parked_events and outbox_blocked_aggregates, by event type.
//
// Because it reads the database rather than the relay's memory, a relay
// that stopped or hangs shows a growing age, never a flattering zero. The
// table is read at most once per refresh interval, whatever the number of
// scrapes and scrapers, and the age is computed at each scrape as now minus
// the oldest pending commit time read then: it keeps growing between
// refreshes. Every process that exports it reports the same table, so
// aggregate with max(), not sum(). It works without a running relay: a
// service with its relay disabled can still register it.
type StatsCollector struct {
	pool        *pgxpool.Pool
	independent []string
	known       []string
	log         *slog.Logger
	timeout     time.Duration
	every       time.Duration

	mu   sync.Mutex
	last statsSnapshot

	pending, oldest, parked, blocked, up *prometheus.Desc
}

// statsSnapshot is one read of the table.
type statsSnapshot struct {
	at      time.Time
	err     error
	stats   []outboxdb.OutboxStatsRow
	blocked []outboxdb.OutboxBlockedAggregatesRow
}

// DefaultStatsRefresh is how often StatsCollector reads the table.
const DefaultStatsRefresh = 5 * time.Second

// NewStatsCollector returns a collector over the outbox in pool. types
// tells strict from independent (for the blocked-aggregates gauge) and
// lists the types that always get a series, zero when idle.
func NewStatsCollector(pool *pgxpool.Pool, types []outbox.EventType, log *slog.Logger) *StatsCollector {
	if log == nil {
		log = slog.Default()
	}
	c := &StatsCollector{
		pool:    pool,
		log:     log,
		timeout: 5 * time.Second,
		every:   DefaultStatsRefresh,
		pending: prometheus.NewDesc("outbox_pending_events",
			"Undelivered, unparked outbox events, by event type.", []string{"event_type"}, nil),
		oldest: prometheus.NewDesc("outbox_oldest_pending_age_seconds",
			"Age of the oldest pending outbox event since its commit, by event type; grows while nothing delivers.", []string{"event_type"}, nil),
		parked: prometheus.NewDesc("outbox_parked_events",
			"Outbox events parked after a deterministic failure, awaiting repair, by event type.", []string{"event_type"}, nil),
		blocked: prometheus.NewDesc("outbox_blocked_aggregates",
			"Aggregates whose parked event holds back later strict events, by the parked event's type.", []string{"event_type"}, nil),
		up: prometheus.NewDesc("outbox_stats_up",
			"1 if the outbox backlog could be read from the database at the last refresh, else 0.", nil, nil),
	}
	for _, t := range types {
		c.known = append(c.known, t.Name)
		if t.Ordering == outbox.Independent {
			c.independent = append(c.independent, t.Name)
		}
	}
	return c
}

// Describe implements prometheus.Collector.
func (c *StatsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.pending, c.oldest, c.parked, c.blocked, c.up} {
		ch <- d
	}
}

// snapshot returns the last read of the table, reading it again when it is
// older than the refresh interval. Concurrent scrapes wait for one read.
func (c *StatsCollector) snapshot() statsSnapshot {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.last.at.IsZero() && time.Since(c.last.at) < c.every {
		return c.last
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	q := outboxdb.New(c.pool)
	s := statsSnapshot{at: time.Now()}
	s.stats, s.err = q.OutboxStats(ctx)
	if s.err == nil {
		s.blocked, s.err = q.OutboxBlockedAggregates(ctx, c.independent)
	}
	if s.err != nil {
		c.log.WarnContext(ctx, "read outbox backlog for metrics", "error", s.err)
	}
	c.last = s
	return s
}

// Collect implements prometheus.Collector. A database error is logged and
// reported as outbox_stats_up 0, without failing the whole scrape.
func (c *StatsCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.snapshot()
	if s.err != nil {
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 1)

	now := time.Now()
	seen := map[string]bool{}
	for _, st := range s.stats {
		seen[st.EventType] = true
		age := 0.0
		if st.Pending > 0 {
			age = max(now.Sub(st.OldestPending).Seconds(), 0)
		}
		ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(st.Pending), st.EventType)
		ch <- prometheus.MustNewConstMetric(c.parked, prometheus.GaugeValue, float64(st.Parked), st.EventType)
		ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, age, st.EventType)
	}
	for _, name := range c.known {
		if !seen[name] {
			ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, 0, name)
			ch <- prometheus.MustNewConstMetric(c.parked, prometheus.GaugeValue, 0, name)
			ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, 0, name)
		}
	}
	seenBlocked := map[string]bool{}
	for _, b := range s.blocked {
		seenBlocked[b.EventType] = true
		ch <- prometheus.MustNewConstMetric(c.blocked, prometheus.GaugeValue, float64(b.Blocked), b.EventType)
	}
	for _, name := range c.known {
		if !seenBlocked[name] {
			ch <- prometheus.MustNewConstMetric(c.blocked, prometheus.GaugeValue, 0, name)
		}
	}
}

// register adds cs to reg, tolerating nothing: registering one relay's
// metrics twice is a wiring mistake worth refusing at start-up.
func register(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	if reg == nil {
		return nil
	}
	var errs []error
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
