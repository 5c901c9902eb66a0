package inbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/orders/internal/inbox/inboxdb"
)

// DBTX is what the inbox's standalone writes need: a pool, a connection or
// a transaction.
type DBTX = inboxdb.DBTX

// ErrRetentionTooShort is returned by CheckRetention.
var ErrRetentionTooShort = errors.New("processed_event retention too short")

// CheckRetention enforces C5: a processed_event marker must outlive every
// way the same event can come back. The broker may redeliver within its
// redelivery window, and restoring the consumer's database from the oldest
// backup brings back offsets that old, so the broker replays everything
// since. A marker deleted before both have passed turns a late copy into a
// second business effect.
func CheckRetention(ttl, brokerRedelivery, backupRetention time.Duration) error {
	if need := brokerRedelivery + backupRetention; ttl < need {
		return fmt.Errorf("%w: PROCESSED_EVENT_TTL=%s is shorter than BROKER_REDELIVERY_WINDOW (%s) + BACKUP_RETENTION (%s) = %s; "+
			"a redelivered or replayed event older than the TTL would be applied again",
			ErrRetentionTooShort, ttl, brokerRedelivery, backupRetention, need)
	}
	return nil
}

// cleanupLockKey serialises cleaners across instances (O6).
const cleanupLockKey = 7_215_402_114

// Cleanup deletes processed_event markers older than ttl, batchSize rows per
// transaction, until no expired row is left. Each batch is its own short
// transaction holding an advisory lock, so only one instance cleans at a
// time and none holds locks for long. Markers of held or parked events are
// never deleted. It returns the number of rows deleted.
func (ib *Inbox) Cleanup(ctx context.Context, pool *pgxpool.Pool, ttl time.Duration, batchSize int) (int64, error) {
	if batchSize <= 0 || ttl <= 0 {
		return 0, fmt.Errorf("clean up processed events: batch size (%d) and TTL (%s) must be positive", batchSize, ttl)
	}
	var total int64
	for {
		var n int64
		var locked bool
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			q := inboxdb.New(tx)
			var err error
			if locked, err = q.ProcessedEventCleanupLock(ctx, cleanupLockKey); err != nil || !locked {
				return err
			}
			n, err = q.ProcessedEventCleanup(ctx, inboxdb.ProcessedEventCleanupParams{TtlSeconds: ttl.Seconds(), BatchSize: int32(batchSize)})
			return err
		})
		if err != nil {
			return total, fmt.Errorf("clean up processed events: %w", err)
		}
		total += n
		ib.metrics.Cleaned.Add(float64(n))
		if !locked || n < int64(batchSize) {
			return total, nil
		}
	}
}

// Stats are the inbox's table counts.
type Stats struct {
	Held          int64 // events held for a gap
	ParkedEvents  int64 // held events parked by a failed resync
	ParkedRecords int64 // undecodable records parked by ParkRecord
	GapsOverdue   int64 // aggregates past their gap window
}

// RefreshStats reads the inbox's counts and sets its gauges.
func (ib *Inbox) RefreshStats(ctx context.Context, db DBTX) (Stats, error) {
	q := inboxdb.New(db)
	hs, err := q.InboxHeldStats(ctx)
	if err != nil {
		return Stats{}, fmt.Errorf("count held events: %w", err)
	}
	pr, err := q.InboxParkedRecordCount(ctx)
	if err != nil {
		return Stats{}, fmt.Errorf("count parked records: %w", err)
	}
	overdue, err := q.InboxGapsOverdueCount(ctx, ib.gapWindow.Seconds())
	if err != nil {
		return Stats{}, fmt.Errorf("count overdue gaps: %w", err)
	}
	s := Stats{Held: hs.Held, ParkedEvents: hs.Parked, ParkedRecords: pr, GapsOverdue: overdue}
	ib.metrics.Held.Set(float64(s.Held))
	ib.metrics.Parked.Set(float64(s.ParkedEvents))
	ib.metrics.GapsOverdue.Set(float64(s.GapsOverdue))
	return s, nil
}

// Header is one raw message header of a parked record.
type Header struct {
	Key string `json:"key"`
	// Value holds the header value when it is valid UTF-8.
	Value string `json:"value,omitempty"`
	// Binary holds the header value when it is not (base64 in JSON).
	Binary []byte `json:"binary,omitempty"`
}

// NewHeader keeps a header value readable when it is text.
func NewHeader(key string, value []byte) Header {
	if utf8.Valid(value) {
		return Header{Key: key, Value: string(value)}
	}
	return Header{Key: key, Binary: value}
}

// Record is a raw message that could not be turned into an Event (C6).
type Record struct {
	// Source names where it came from, for example the topic.
	Source    string
	Partition int32
	Offset    int64
	// EventID is the raw event id header, when there was one.
	EventID string
	Key     []byte
	Value   []byte
	Headers []Header
	// Reason says why it could not be processed.
	Reason string
}

// ParkRecord stores a poison record with its raw key, value and headers so
// that it neither blocks its partition nor vanishes. Parking the same
// position twice (a redelivery after a crash) stores it once; the result
// says whether this call stored it.
func ParkRecord(ctx context.Context, db DBTX, r Record) (bool, error) {
	headers, err := json.Marshal(r.Headers)
	if err != nil {
		return false, fmt.Errorf("encode parked record headers: %w", err)
	}
	if r.Headers == nil {
		headers = []byte("[]")
	}
	var eventID *string
	if r.EventID != "" {
		eventID = &r.EventID
	}
	n, err := inboxdb.New(db).InboxParkedRecordInsert(ctx, inboxdb.InboxParkedRecordInsertParams{
		Source: r.Source, Partition: r.Partition, RecordOffset: r.Offset, EventID: eventID,
		RecordKey: r.Key, RecordValue: r.Value, Headers: headers, Reason: r.Reason,
	})
	if err != nil {
		return false, fmt.Errorf("park record %s/%d@%d: %w", r.Source, r.Partition, r.Offset, err)
	}
	return n == 1, nil
}
