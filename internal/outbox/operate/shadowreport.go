package operate

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/outboxref/orders/internal/outbox/operate/internal/opsdb"
)

// ShadowCount is how many shadow events of one type compared one way.
type ShadowCount struct {
	EventType string `json:"event_type"`
	// Result is match, mismatch, missing, or pending (not compared yet).
	Result string `json:"result"`
	Count  int64  `json:"count"`
}

// ShadowDiff is one shadow event that did not match.
type ShadowDiff struct {
	EventID   uuid.UUID `json:"event_id"`
	EventType string    `json:"event_type"`
	SentAt    time.Time `json:"sent_at"`
	Result    string    `json:"result"`
	Detail    string    `json:"detail"`
}

// ShadowReport is what shadow mode found since a time: whether the relay
// would send exactly what the direct path sends. A type is ready for
// outbox mode when it has matches and no mismatch or missing event.
type ShadowReport struct {
	Since  time.Time     `json:"since"`
	Counts []ShadowCount `json:"counts"`
	Diffs  []ShadowDiff  `json:"diffs"`
}

// ShadowReport reports the shadow comparisons of events sent since since,
// of one type or all (eventType ""), with up to limit differences (50
// when zero).
func (a *Admin) ShadowReport(ctx context.Context, eventType string, since time.Time, limit int) (ShadowReport, error) {
	if limit <= 0 {
		limit = 50
	}
	typ := orNil(eventType)
	q := opsdb.New(a.pool)
	counts, err := q.ShadowReportCounts(ctx, opsdb.ShadowReportCountsParams{Since: since, EventType: typ})
	if err != nil {
		return ShadowReport{}, fmt.Errorf("shadow report: %w", err)
	}
	diffs, err := q.ShadowReportDiffs(ctx, opsdb.ShadowReportDiffsParams{Since: since, EventType: typ, RowLimit: int32(limit)})
	if err != nil {
		return ShadowReport{}, fmt.Errorf("shadow report: %w", err)
	}
	rep := ShadowReport{Since: since, Counts: make([]ShadowCount, len(counts)), Diffs: make([]ShadowDiff, len(diffs))}
	for i, c := range counts {
		rep.Counts[i] = ShadowCount{EventType: c.EventType, Result: c.Result, Count: c.N}
	}
	for i, d := range diffs {
		rep.Diffs[i] = ShadowDiff{EventID: d.EventID, EventType: d.EventType, SentAt: d.SentAt, Result: d.Result, Detail: d.Detail}
	}
	return rep, nil
}
