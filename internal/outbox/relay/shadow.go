package relay

import (
	"context"
	"fmt"

	"github.com/google/uuid"

	"github.com/outboxref/orders/internal/outbox/internal/direct"
	"github.com/outboxref/orders/internal/outbox/internal/outboxdb"
)

// Shadow comparison results, as stored in outbox_direct_log.shadow_result
// and labelled in outbox_shadow_compared_total.
const (
	ShadowMatch    = "match"
	ShadowMismatch = "mismatch"
	ShadowMissing  = "missing"
)

// shadowOutcome is the comparison of one shadow row.
type shadowOutcome struct {
	claim
	result, detail string
}

// compareShadow builds the record of every shadow row of a claim, as the
// relay would send it, and compares it with the direct path's log.
func (r *Relay) compareShadow(ctx context.Context, rows []*leased) ([]shadowOutcome, error) {
	ids := make([]uuid.UUID, len(rows))
	for i, l := range rows {
		ids[i] = l.EventID
	}
	logged, err := outboxdb.New(r.cfg.Pool).DirectLogForEvents(ctx, ids)
	if err != nil {
		return nil, fmt.Errorf("read the direct path's log of %d shadow events: %w", len(ids), err)
	}
	byID := make(map[uuid.UUID]outboxdb.DirectLogForEventsRow, len(logged))
	for _, l := range logged {
		byID[l.EventID] = l
	}
	out := make([]shadowOutcome, len(rows))
	for i, l := range rows {
		o := shadowOutcome{claim: l.claim, result: ShadowMatch}
		entry, ok := byID[l.EventID]
		switch {
		case !ok:
			o.result, o.detail = ShadowMissing, "the direct path logged no send of this event"
		default:
			if _, err := admit(r.types, l.EventType, l.SchemaVersion); err != nil {
				o.result, o.detail = ShadowMismatch, "the relay would park it: "+err.Error()
			} else if diff := direct.DigestRecord(r.buildRecord(l, l.traceparent, l.tracestate)).Compare(entry); diff != "" {
				o.result, o.detail = ShadowMismatch, diff
			}
		}
		out[i] = o
	}
	return out, nil
}

// settleShadow marks compared shadow rows delivered, fenced by the epochs
// of their partitions, and records each comparison. A row whose partition
// was taken over is left to the relay that owns it now.
func (r *Relay) settleShadow(ctx context.Context, outs []shadowOutcome) error {
	claims := make([]claim, len(outs))
	for i := range outs {
		claims[i] = outs[i].claim
	}
	f := fenceOf(claims)
	p := outboxdb.ShadowSettleParams{Owner: r.cfg.Owner, FencePartitions: f.partitions, FenceEpochs: f.epochs}
	for _, o := range outs {
		p.EventIDs = append(p.EventIDs, o.EventID)
		p.EventTypes = append(p.EventTypes, o.EventType)
		p.Results = append(p.Results, o.result)
		p.Details = append(p.Details, boundText(o.detail))
	}
	var ids []uuid.UUID
	err := retrySafe(ctx, func() (err error) {
		ids, err = outboxdb.ShadowSettleCustomPlan(ctx, r.cfg.Pool, p)
		return err
	})
	if err != nil {
		return fmt.Errorf("settle %d shadow events: %w", len(outs), err)
	}
	matched := make(map[uuid.UUID]bool, len(ids))
	for _, id := range ids {
		matched[id] = true
	}
	for i := range outs {
		o := &outs[i]
		if !matched[o.EventID] {
			continue // the partition was taken over; the new owner compares it again
		}
		r.metrics.shadow.WithLabelValues(o.EventType, o.result).Inc()
		if o.result != ShadowMatch {
			r.log.WarnContext(ctx, "shadow comparison: the relay would not have sent what the direct path sent",
				"event_id", o.EventID, "event_type", o.EventType, "aggregate_id", o.AggregateID,
				"aggregate_version", o.AggregateVersion, "result", o.result, "detail", o.detail)
		}
	}
	return nil
}
