package notify

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxref/orders/internal/notify/notifydb"
)

// UnknownPolicy says what happens to an email whose outcome is unknown.
type UnknownPolicy string

const (
	// PolicyHold leaves unknown emails alone: they are counted, logged and
	// wait for an operator (ResolveEmail). Nobody gets a second email
	// because a connection dropped. This is the default.
	PolicyHold UnknownPolicy = "hold"
	// PolicyResend sends unknown emails again with the same Message-ID,
	// for receivers that deduplicate on it.
	PolicyResend UnknownPolicy = "resend"
)

// SenderConfig tunes the Sender.
type SenderConfig struct {
	// From is the envelope and header sender.
	From string
	// Owner names this instance in claimed_by, for operators.
	Owner string
	// Policy decides about unknown outcomes.
	Policy UnknownPolicy
	// BatchSize is how many rows one claim takes.
	BatchSize int
	// PollInterval is how often the ledger is checked without a nudge.
	PollInterval time.Duration
	// SendingTimeout is how long a row may stay 'sending' before it is
	// presumed abandoned by a dead sender and becomes unknown. It must be
	// at least twice the mailer's own timeout: a claimed row is started only
	// within the first half of it, so a live send is never declared dead.
	// Zero means five minutes.
	SendingTimeout time.Duration
	// MaxAttempts bounds the sends of one row; then it is failed (parked).
	MaxAttempts int
	// BackoffBase and BackoffCap bound the exponential retry delay.
	BackoffBase time.Duration
	BackoffCap  time.Duration
}

// Sender is the send ledger's worker (C4): it claims pending rows in a short
// transaction, sends each one outside any transaction, and records the
// result with an update fenced by the claim token. The ledger write that
// created the row and the send are therefore never in one transaction,
// and a crash at any point leaves a row that says what is known.
type Sender struct {
	pool    *pgxpool.Pool
	mailer  Mailer
	cfg     SenderConfig
	metrics *Metrics
	log     *slog.Logger
	nudge   chan struct{}
}

// NewSender returns a Sender.
func NewSender(pool *pgxpool.Pool, mailer Mailer, cfg SenderConfig, m *Metrics, log *slog.Logger) *Sender {
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = 10
	}
	if cfg.Owner == "" {
		cfg.Owner = "notifier"
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 10
	}
	if cfg.Policy == "" {
		cfg.Policy = PolicyHold
	}
	if cfg.SendingTimeout <= 0 {
		cfg.SendingTimeout = 5 * time.Minute
	}
	if cfg.BackoffBase <= 0 {
		cfg.BackoffBase = time.Second
	}
	cfg.BackoffCap = max(cfg.BackoffCap, cfg.BackoffBase)
	if log == nil {
		log = slog.Default()
	}
	m.UnknownPolicy.WithLabelValues(string(cfg.Policy)).Set(1)
	return &Sender{pool: pool, mailer: mailer, cfg: cfg, metrics: m, log: log, nudge: make(chan struct{}, 1)}
}

// Nudge wakes the sender after new ledger rows committed, so an email does
// not wait for the next poll.
func (s *Sender) Nudge() {
	select {
	case s.nudge <- struct{}{}:
	default:
	}
}

// Run sends until ctx is cancelled. A send in progress when ctx ends is
// finished (it is bounded by the mailer's timeout); claimed rows not yet
// started are released.
func (s *Sender) Run(ctx context.Context) error {
	t := time.NewTicker(s.cfg.PollInterval)
	defer t.Stop()
	for {
		if err := s.sweepStuck(ctx); err != nil && ctx.Err() == nil {
			s.log.ErrorContext(ctx, "email sender: sweep of stuck sends failed", slog.String("error", err.Error()))
		}
		for ctx.Err() == nil {
			n, err := s.RunOnce(ctx)
			if err != nil {
				if ctx.Err() == nil {
					s.log.ErrorContext(ctx, "email sender: claim failed", slog.String("error", err.Error()))
				}
				break
			}
			if n < s.cfg.BatchSize {
				break
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-s.nudge:
		case <-t.C:
		}
	}
}

// RunOnce claims one batch of due rows and sends them. It returns how many
// rows it claimed.
func (s *Sender) RunOnce(ctx context.Context) (int, error) {
	token := uuid.New()
	// Taken before the claim, so it is never later than the claim's
	// sending_since, from which the stuck sweep counts.
	claimedAt := time.Now()
	if ctx.Err() != nil {
		return 0, nil
	}
	// The claim does not follow ctx: cancelled mid-statement, pgx would
	// drop the connection without knowing whether the server committed, and
	// a committed claim would be left 'sending' with no sender, to become
	// 'unknown' later although nothing was sent. Once it returns, the loop
	// below gives the rows back if the sender is stopping.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	rows, err := notifydb.New(s.pool).EmailSendClaim(cctx, notifydb.EmailSendClaimParams{
		ClaimToken: token, ClaimedBy: s.cfg.Owner, ResendUnknown: s.cfg.Policy == PolicyResend,
		MaxAttempts: int32(s.cfg.MaxAttempts), BatchSize: int32(s.cfg.BatchSize),
	})
	if err != nil {
		return 0, fmt.Errorf("claim emails: %w", err)
	}
	// UPDATE ... RETURNING does not keep the subquery's order. Send in the
	// order the intents were written, so one order's emails arrive in the
	// order of its events when nothing fails (a retried email can still be
	// overtaken: email has no ordering guarantee to keep).
	slices.SortFunc(rows, func(a, b notifydb.EmailSend) int {
		return cmp.Or(a.CreatedAt.Compare(b.CreatedAt), cmp.Compare(a.OperationKey, b.OperationKey))
	})
	// Results are recorded even while stopping: a sent email must end up
	// 'sent', never left for the sweep to call unknown.
	// The rows of a batch are sent one after the other, but the sweep
	// counts 'sending' from the claim for all of them. A row still waiting
	// when half the sending timeout has passed is given back, not started:
	// started later, a slow send could be declared unknown while it runs
	// (and, under the resend policy, sent again by another instance).
	bg := context.WithoutCancel(ctx)
	for i, row := range rows {
		if ctx.Err() != nil || time.Since(claimedAt) >= s.cfg.SendingTimeout/2 {
			s.release(bg, token, rows[i:])
			break
		}
		s.send(bg, token, row)
	}
	return len(rows), nil
}

func (s *Sender) send(ctx context.Context, token uuid.UUID, row notifydb.EmailSend) {
	log := s.log.With(slog.String("event_id", row.EventID.String()), slog.String("operation_key", row.OperationKey),
		slog.String("order_id", row.OrderID.String()), slog.String("event_type", row.EventType), slog.Int("attempt", int(row.Attempts)))
	if row.LastErrorClass != nil && (*row.LastErrorClass == "unknown" || *row.LastErrorClass == "sending_timeout") {
		s.metrics.Resends.Inc()
		log.WarnContext(ctx, "email sender: resending an email whose outcome was unknown, with the same Message-ID",
			slog.String("message_id", row.MessageID))
	}
	reply, err := s.mailer.Send(ctx, s.cfg.From, row.Recipient, buildMessage(s.cfg.From, row))

	q := notifydb.New(s.pool)
	dbctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var n int64
	var dberr error
	result := ResultSent
	switch {
	case err == nil:
		n, dberr = q.EmailSendMarkSent(dbctx, notifydb.EmailSendMarkSentParams{SMTPReply: reply, OperationKey: row.OperationKey, ClaimToken: token})
		log.InfoContext(ctx, "email sent", slog.String("message_id", row.MessageID))
	case errors.Is(err, ErrUnknownOutcome):
		result = ResultUnknown
		n, dberr = q.EmailSendMarkUnknown(dbctx, notifydb.EmailSendMarkUnknownParams{
			BackoffSeconds: s.backoff(row.Attempts).Seconds(), ErrorClass: "unknown", LastError: err.Error(),
			OperationKey: row.OperationKey, ClaimToken: token,
		})
		if s.cfg.Policy == PolicyHold {
			log.ErrorContext(ctx, "email outcome unknown: held for an operator, not resent automatically (EMAIL_UNKNOWN_POLICY=hold)",
				slog.String("error", err.Error()))
		} else {
			log.WarnContext(ctx, "email outcome unknown: will resend with the same Message-ID (EMAIL_UNKNOWN_POLICY=resend)",
				slog.String("error", err.Error()))
		}
	case errors.Is(err, ErrTransient) && int(row.Attempts) < s.cfg.MaxAttempts:
		result = ResultTransient
		delay := s.backoff(row.Attempts)
		n, dberr = q.EmailSendMarkRetry(dbctx, notifydb.EmailSendMarkRetryParams{
			BackoffSeconds: delay.Seconds(), ErrorClass: "transient", LastError: err.Error(),
			OperationKey: row.OperationKey, ClaimToken: token,
		})
		log.WarnContext(ctx, "email send failed transiently; will retry", slog.String("error", err.Error()), slog.Duration("retry_in", delay))
	default:
		result = ResultFailed
		class := "permanent"
		if !errors.Is(err, ErrPermanent) {
			class = "attempts_exhausted"
		}
		n, dberr = q.EmailSendMarkFailed(dbctx, notifydb.EmailSendMarkFailedParams{
			ErrorClass: class, LastError: err.Error(), OperationKey: row.OperationKey, ClaimToken: token,
		})
		log.ErrorContext(ctx, "email send failed; parked for an operator", slog.String("error_class", class), slog.String("error", err.Error()))
	}
	s.metrics.Emails.WithLabelValues(result).Inc()
	switch {
	case dberr != nil:
		// The row stays 'sending'; the stuck sweep turns it into unknown,
		// which is exactly what is known about it now.
		log.ErrorContext(ctx, "email sender: could not record the send result", slog.String("result", result), slog.String("error", dberr.Error()))
	case n != 1:
		log.WarnContext(ctx, "email sender: claim lost before the result was recorded", slog.String("result", result))
	}
}

func (s *Sender) release(ctx context.Context, token uuid.UUID, rows []notifydb.EmailSend) {
	q := notifydb.New(s.pool)
	for _, r := range rows {
		if _, err := q.EmailSendRelease(ctx, notifydb.EmailSendReleaseParams{OperationKey: r.OperationKey, ClaimToken: token}); err != nil {
			s.log.ErrorContext(ctx, "email sender: release of an unsent claim failed; the sweep will mark it unknown",
				slog.String("operation_key", r.OperationKey), slog.String("error", err.Error()))
		}
	}
}

// sweepStuck turns rows left 'sending' by a dead sender into unknown.
func (s *Sender) sweepStuck(ctx context.Context) error {
	rows, err := notifydb.New(s.pool).EmailSendSweepStuck(ctx, s.cfg.SendingTimeout.Seconds())
	if err != nil {
		return fmt.Errorf("sweep stuck sends: %w", err)
	}
	for _, r := range rows {
		s.metrics.Emails.WithLabelValues(ResultUnknown).Inc()
		s.log.ErrorContext(ctx, "email stuck in sending past the timeout: outcome unknown, not resent silently",
			slog.String("event_id", r.EventID.String()), slog.String("operation_key", r.OperationKey),
			slog.Duration("sending_timeout", s.cfg.SendingTimeout), slog.String("policy", string(s.cfg.Policy)))
	}
	return nil
}

// backoff is exponential in the attempt number with ±20% jitter, so rows
// that failed together do not retry together.
func (s *Sender) backoff(attempt int32) time.Duration {
	d := s.cfg.BackoffBase
	for i := int32(1); i < attempt && d < s.cfg.BackoffCap; i++ {
		d *= 2
	}
	d = min(d, s.cfg.BackoffCap)
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}

// RefreshLedgerStats sets the ledger gauges from the table.
func RefreshLedgerStats(ctx context.Context, db notifydb.DBTX, m *Metrics) error {
	rows, err := notifydb.New(db).EmailSendCountByState(ctx)
	if err != nil {
		return fmt.Errorf("count ledger rows: %w", err)
	}
	for _, st := range []string{StatePending, StateSending, StateSent, StateUnknown, StateFailed} {
		m.Ledger.WithLabelValues(st).Set(0)
	}
	for _, r := range rows {
		m.Ledger.WithLabelValues(r.State).Set(float64(r.N))
	}
	return nil
}

// CleanupLedger deletes sent ledger rows older than ttl in batches of
// batchSize, each batch its own short statement. The notifier uses the
// processed_event TTL: a redelivery older than that is a duplicate by
// version anyway, and no longer needs its ledger row to be recognised.
func CleanupLedger(ctx context.Context, db notifydb.DBTX, ttl time.Duration, batchSize int) (int64, error) {
	if batchSize <= 0 || ttl <= 0 {
		return 0, fmt.Errorf("clean up sent emails: batch size (%d) and TTL (%s) must be positive", batchSize, ttl)
	}
	var total int64
	for {
		n, err := notifydb.New(db).EmailSendCleanup(ctx, notifydb.EmailSendCleanupParams{TtlSeconds: ttl.Seconds(), BatchSize: int32(batchSize)})
		if err != nil {
			return total, fmt.Errorf("clean up sent emails: %w", err)
		}
		total += n
		if n < int64(batchSize) {
			return total, nil
		}
	}
}

// ErrNotResolvable is returned by ResolveEmail for a row that is not
// unknown or failed.
var ErrNotResolvable = errors.New("email is not unknown or failed")

// Resolutions an operator can choose for an unknown or failed email.
const (
	ResolveSent   = "sent"   // confirmed delivered (for example in the relay's logs)
	ResolveResend = "resend" // send once more, with the same Message-ID
	ResolveFailed = "failed" // give up
)

// ResolveEmail records an operator's decision about an unknown or failed
// email, with the actor, and applies it. This is the hold policy's way out.
func ResolveEmail(ctx context.Context, db notifydb.DBTX, operationKey, resolution, actor string) error {
	state := map[string]string{ResolveSent: StateSent, ResolveResend: StatePending, ResolveFailed: StateFailed}[resolution]
	if state == "" {
		return fmt.Errorf("resolution %q: want sent, resend or failed", resolution)
	}
	if actor == "" {
		return errors.New("resolution needs an actor")
	}
	n, err := notifydb.New(db).EmailSendResolve(ctx, notifydb.EmailSendResolveParams{
		NewState: state, Actor: actor, Resolution: resolution, OperationKey: operationKey,
	})
	if err != nil {
		return fmt.Errorf("resolve email %s: %w", operationKey, err)
	}
	if n != 1 {
		return fmt.Errorf("resolve email %s: %w", operationKey, ErrNotResolvable)
	}
	return nil
}
