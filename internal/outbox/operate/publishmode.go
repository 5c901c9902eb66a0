package operate

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/outboxref/orders/internal/outbox"
	"github.com/outboxref/orders/internal/outbox/operate/internal/opsdb"
)

// PublishMode says which path sends the events of one type while a
// service migrates from publishing inside its transaction to the outbox
// (O7). An operator switches it per event type with Admin.SetPublishMode;
// it moves forward direct → shadow → outbox and can move back at any time.
type PublishMode string

const (
	// ModeDirect is the legacy way: the Writer's DirectPublisher sends each
	// event from inside the business transaction, before it commits. This
	// is the dual write the outbox exists to remove: a commit that fails
	// after the send leaves consumers with an event for a change that never
	// happened, and a process that dies between the send and the commit
	// does the same. It is what a service migrates away from, kept only so
	// that the migration can start from where the service is. The row is
	// still written (delivered), so that switching back later loses nothing.
	ModeDirect PublishMode = "direct"
	// ModeShadow keeps the direct path sending, and has the relay build the
	// record it would send, compare it with what the direct path logged,
	// and send nothing. Mismatches are counted in
	// outbox_shadow_compared_total and listed by Admin.ShadowReport.
	ModeShadow PublishMode = "shadow"
	// ModeOutbox is the relay alone, and the default of every event type.
	ModeOutbox PublishMode = "outbox"
)

// ParsePublishMode returns the mode named s.
func ParsePublishMode(s string) (PublishMode, error) {
	switch m := PublishMode(s); m {
	case ModeDirect, ModeShadow, ModeOutbox:
		return m, nil
	}
	return "", fmt.Errorf("%w: %q is not direct, shadow or outbox", ErrInvalidPublishMode, s)
}

// ErrInvalidPublishMode means a mode other than direct, shadow and outbox.
var ErrInvalidPublishMode = errors.New("outbox: invalid publish mode")

// ModeSetting is one event type's publish mode.
type ModeSetting struct {
	EventType string      `json:"event_type"`
	Mode      PublishMode `json:"mode"`
	// ChangedAt and ChangedBy are zero for a type that never left outbox
	// mode, or went back to it (the audit trail keeps the history).
	ChangedAt time.Time `json:"changed_at,omitzero"`
	ChangedBy string    `json:"changed_by,omitempty"`
}

// PublishModes lists the mode of every event type the Admin's Writer knows,
// and of any other type that has a mode set.
func (a *Admin) PublishModes(ctx context.Context) ([]ModeSetting, error) {
	rows, err := opsdb.New(a.pool).PublishModes(ctx)
	if err != nil {
		return nil, fmt.Errorf("list publish modes: %w", err)
	}
	set := make(map[string]ModeSetting, len(rows))
	for _, r := range rows {
		set[r.EventType] = ModeSetting{EventType: r.EventType, Mode: PublishMode(r.Mode), ChangedAt: r.ChangedAt, ChangedBy: r.ChangedBy}
	}
	if a.writer != nil {
		for _, t := range a.writer.EventTypes() {
			if _, ok := set[t.Name]; !ok {
				set[t.Name] = ModeSetting{EventType: t.Name, Mode: ModeOutbox}
			}
		}
	}
	return slices.SortedFunc(maps.Values(set), func(x, y ModeSetting) int { return strings.Compare(x.EventType, y.EventType) }), nil
}

// SetPublishMode switches eventType to mode, audited with the actor. It
// returns the mode the type had before.
//
// Every event is sent by the path its own row names, decided by the insert
// that wrote it, so a switch never makes an event sent twice or not at
// all. Writes already in flight when the switch commits keep the mode
// they read: for a moment both paths may be sending, each its own events.
// Going back from outbox to shadow or direct keeps the table and every
// event in it; events already pending are still delivered by the relay.
func (a *Admin) SetPublishMode(ctx context.Context, actor Actor, eventType string, mode PublishMode) (PublishMode, error) {
	if err := actor.check(); err != nil {
		return "", err
	}
	if _, err := ParsePublishMode(string(mode)); err != nil {
		return "", err
	}
	if a.writer != nil {
		known := slices.ContainsFunc(a.writer.EventTypes(), func(t outbox.EventType) bool { return t.Name == eventType })
		if !known {
			return "", fmt.Errorf("%w: %q", outbox.ErrUnknownEventType, eventType)
		}
	}
	var before PublishMode
	err := pgx.BeginFunc(ctx, a.pool, func(tx pgx.Tx) error {
		q := opsdb.New(tx)
		cur, err := q.PublishModeLock(ctx, eventType)
		if err != nil {
			return fmt.Errorf("read publish mode: %w", err)
		}
		before = PublishMode(cur)
		if mode == ModeOutbox {
			err = q.PublishModeClear(ctx, eventType)
		} else {
			err = q.PublishModeSet(ctx, opsdb.PublishModeSetParams{EventType: eventType, Mode: string(mode), ChangedBy: actor.Subject})
		}
		if err != nil {
			return fmt.Errorf("set publish mode: %w", err)
		}
		detail, _ := json.Marshal(map[string]PublishMode{"from": before, "to": mode}) // cannot fail
		return writeAudit(ctx, q, actor, "publish_mode", eventType, modeHash(before), modeHash(mode), detail)
	})
	if err != nil {
		return "", fmt.Errorf("switch %s to %s mode: %w", eventType, mode, err)
	}
	return before, nil
}

// modeHash stands for a mode in the audit's before and after columns.
func modeHash(m PublishMode) []byte {
	sum := sha256.Sum256([]byte(m))
	return sum[:]
}
