package invoices

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxref/orders/examples/invoices/invoicesdb"
	"github.com/outboxref/orders/internal/inbox"
)

// The ledger is the consuming half: it reads the invoice events from Kafka
// and adds each issued invoice to its customer's line in invoice_totals,
// through the inbox, so that a redelivered event is counted once.

// maxApplyAttempts bounds the attempts at a record whose processing fails
// for a reason of its own (a payload this consumer cannot read): it is then
// parked rather than block its partition for ever (C6). Failures of the
// database itself are retried without limit, since parking would set good
// records aside.
const maxApplyAttempts = 3

// apply is the inbox's ApplyFunc: the ledger change of one event, inside
// the transaction that also writes the inbox's processed_event marker. An
// error rolls both back.
func (s *Service) apply(ctx context.Context, tx pgx.Tx, e inbox.Event) error {
	if e.Type != EventIssued {
		// A type this consumer does not use yet: recording it as processed
		// keeps the invoice's versions moving, so its later events are not
		// held behind it.
		return nil
	}
	if e.SchemaVersion != 1 {
		return fmt.Errorf("%s schema version %d is not one this ledger reads", e.Type, e.SchemaVersion)
	}
	var p issuedV1
	if err := json.Unmarshal(e.Payload, &p); err != nil {
		return fmt.Errorf("decode %s payload: %w", e.Type, err)
	}
	if p.Customer == "" || p.TotalCents < 0 {
		return fmt.Errorf("%s payload lacks a customer or has a negative total", e.Type)
	}
	if err := invoicesdb.New(tx).InvoiceTotalAdd(ctx, invoicesdb.InvoiceTotalAddParams{
		Customer: p.Customer, TotalCents: p.TotalCents,
	}); err != nil {
		return fmt.Errorf("add invoice to ledger: %w", err)
	}
	return nil
}

// consume reads the topic as a member of the ledger's consumer group until
// ctx ends. Each record is processed in a local transaction of its own
// (handleRecord), and the offsets of a poll are committed only after every
// record of it was committed locally (C1): a crash before the offset
// commit redelivers records the inbox has already seen, which it absorbs
// as duplicates.
//
// While the database is down, the record in hand is retried with backoff
// and a rebalance waits for it. That keeps this consumer short; the
// notifier's consumer (internal/notify) shows the longer alternative, which
// pauses the partitions and keeps polling meanwhile.
func (s *Service) consume(ctx context.Context) error {
	cl, err := kgo.NewClient(append(slices.Clone(s.cfg.Kafka),
		kgo.ConsumerGroup(s.cfg.Group),
		kgo.ConsumeTopics(s.cfg.Topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		// Offsets are committed by hand, after the local commit (C1).
		kgo.DisableAutoCommit(),
		// A rebalance waits until the records in hand are processed and
		// their offsets committed, so partitions never move with work in
		// hand.
		kgo.BlockRebalanceOnPoll(),
	)...)
	if err != nil {
		return fmt.Errorf("create kafka consumer: %w", err)
	}
	defer func() {
		// Close leaves the group, which is a rebalance: it would wait for
		// a poll that is never allowed to finish.
		cl.AllowRebalance()
		cl.Close()
	}()

	for {
		fetches := cl.PollRecords(ctx, 100)
		if ctx.Err() != nil || fetches.IsClientClosed() {
			return nil
		}
		fetches.EachError(func(topic string, partition int32, err error) {
			s.log.WarnContext(ctx, "kafka fetch error", "topic", topic, "partition", partition, "error", err.Error())
		})
		// Records come partition by partition, in offset order, so one
		// invoice's events (one key, one partition) are applied in order.
		var done []*kgo.Record
		for _, r := range fetches.Records() {
			if err := s.handleRecord(ctx, r); err != nil {
				break // ctx ended: the rest is redelivered to the next owner
			}
			done = append(done, r)
		}
		s.commit(ctx, cl, done)
		cl.AllowRebalance()
	}
}

// handleRecord takes one record to its end: applied or absorbed through
// the inbox in one local transaction, or parked. It returns nil once that
// is committed, or ctx's error if ctx ended first.
func (s *Service) handleRecord(ctx context.Context, r *kgo.Record) error {
	e, err := inbox.DecodeRecord(r)
	if err != nil {
		// Not an event at all: decoding it again can only fail again.
		return s.park(ctx, r, err)
	}
	for attempt := 1; ; attempt++ {
		res, err := s.inbox.Handle(ctx, e) // its own transaction; counts the outcome once committed
		if err == nil {
			s.log.DebugContext(ctx, "invoice event "+string(res.Outcome),
				append(e.LogAttrs(), "partition", r.Partition, "offset", r.Offset)...)
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err() // rolled back by the stop, not by the record
		}
		transient := inbox.IsTransient(err)
		if !transient && (attempt >= maxApplyAttempts || errors.Is(err, inbox.ErrInvalidEvent)) {
			return s.park(ctx, r, fmt.Errorf("processing failed %d times: %w", attempt, err))
		}
		s.log.WarnContext(ctx, "processing invoice event failed; retrying",
			append(e.LogAttrs(), "attempt", attempt, "transient", transient, "error", err.Error())...)
		if err := pause(ctx, attempt); err != nil {
			return err
		}
	}
}

// park stores a record that can never be processed, with its reason, so
// that it neither blocks its partition nor vanishes (C6). Parking fails only
// when the database does, so it is retried until it succeeds or ctx ends.
func (s *Service) park(ctx context.Context, r *kgo.Record, reason error) error {
	for attempt := 1; ; attempt++ {
		stored, err := inbox.ParkRecord(ctx, s.cfg.Pool, r, reason.Error())
		if err == nil {
			s.log.ErrorContext(ctx, "record parked; its offset will be committed",
				"topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "new", stored, "reason", reason.Error())
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		s.log.WarnContext(ctx, "park record failed; retrying",
			"topic", r.Topic, "partition", r.Partition, "offset", r.Offset, "error", err.Error())
		if err := pause(ctx, attempt); err != nil {
			return err
		}
	}
}

// commit commits the offsets of records whose local transaction has
// committed. It runs even when ctx has ended, so that a stopping consumer
// hands over exactly what it finished. A failed commit is only logged: the
// records are redelivered later and absorbed as duplicates.
func (s *Service) commit(ctx context.Context, cl *kgo.Client, done []*kgo.Record) {
	if len(done) == 0 {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := cl.CommitRecords(cctx, done...); err != nil {
		s.log.WarnContext(ctx, "offset commit failed; the records will be redelivered and absorbed as duplicates",
			"records", len(done), "error", err.Error())
	}
}

// pause waits before retry number attempt+1: 100ms doubling up to 5s, or
// until ctx ends.
func pause(ctx context.Context, attempt int) error {
	d := min(100*time.Millisecond<<min(attempt-1, 6), 5*time.Second)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
