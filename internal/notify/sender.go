package notify

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/outboxref/orders/internal/inbox"
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
	// PollInterval is how often the ledger is checked without a nudge.
	PollInterval time.Duration
	// SendingTimeout is how long a row may stay 'sending' before it is
	// presumed abandoned by a dead sender and becomes unknown. It must be
	// at least twice the mailer's own timeout, so a live send is never
	// declared dead. Zero means five minutes.
	SendingTimeout time.Duration
	// MaxAttempts bounds the sends of one row; then it is failed (parked).
	MaxAttempts int
	// BackoffBase and BackoffCap bound the exponential retry delay.
	BackoffBase time.Duration
	BackoffCap  time.Duration
	// Workers is how many emails are sent at once (EMAIL_SENDERS). Each
	// claim is a commit that waits for the disk before the send may begin
	// (it carries the previous email's result), and a send waits on the
	// relay: one worker sends a few hundred emails a second at best.
	// Several workers overlap those waits. Each claims one row per send, from its own
	// share of the orders, so one order's emails never race each other.
	// A crash then leaves up to one row per worker in 'sending', each an
	// unknown outcome, instead of one. Zero means one; at most 256.
	Workers int
	// MaxAge skips, rather than sends, an email whose event is older than
	// this when it could first be sent (EMAIL_MAX_AGE). Zero means 24h.
	MaxAge time.Duration
	// TracerProvider receives the send spans (L4); nil means the global
	// provider.
	TracerProvider trace.TracerProvider
}

// Sender is the send ledger's worker (C4): it claims one due row at a time
// in a short transaction, sends it outside any transaction, and records the
// result with an update fenced by the claim token, in the transaction of
// its next claim. The ledger write that created the row and the send are
// therefore never in one transaction, a crash at any point leaves a row
// that says what is known, and since a row is claimed only when its send
// begins, a crash leaves at most one row per worker (SenderConfig.Workers)
// in 'sending' for the stuck-send sweep to call unknown.
type Sender struct {
	pool    *pgxpool.Pool
	mailer  Mailer
	cfg     SenderConfig
	metrics *Metrics
	log     *slog.Logger
	tracer  trace.Tracer
	nudge   chan struct{}
	// wake holds one channel per worker, for Run: a worker drains its
	// share each time it receives from its own.
	wake []chan struct{}
	// floor is where the claims' pending branch starts
	// (EmailSendPendingFloor); nil or zero: at the beginning of the index.
	floor atomic.Pointer[time.Time]
	// floorLag is pendingFloorLag, changed only by the package's tests.
	floorLag time.Duration
	// floorFailing is set while floor searches fail, so that an outage is
	// logged once rather than once a second.
	floorFailing atomic.Bool
}

// pendingFloorLag is how long an email may stay uncommitted after it was
// written and still be claimed as soon as it commits, not one floor search
// later (EmailSendPendingFloor). Claims step over the rows claimed in this
// window: a few seconds' worth, whatever the ledger's size.
const pendingFloorLag = 5 * time.Second

// pendingFloorEvery is how often the sender looks for the claims' floor.
const pendingFloorEvery = time.Second

// NewSender returns a Sender.
func NewSender(pool *pgxpool.Pool, mailer Mailer, cfg SenderConfig, m *Metrics, log *slog.Logger) *Sender {
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
	if cfg.MaxAge <= 0 {
		cfg.MaxAge = 24 * time.Hour
	}
	cfg.Workers = min(max(cfg.Workers, 1), 256)
	cfg.BackoffCap = max(cfg.BackoffCap, cfg.BackoffBase)
	if log == nil {
		log = slog.Default()
	}
	m.UnknownPolicy.WithLabelValues(string(cfg.Policy)).Set(1)
	wake := make([]chan struct{}, cfg.Workers)
	for w := range wake {
		wake[w] = make(chan struct{}, 1)
	}
	return &Sender{pool: pool, mailer: mailer, cfg: cfg, metrics: m, log: log, tracer: tracerOf(cfg.TracerProvider),
		nudge: make(chan struct{}, 1), wake: wake, floorLag: pendingFloorLag}
}

// Nudge wakes every worker after new ledger rows committed, so an email
// does not wait for the next poll.
func (s *Sender) Nudge() {
	select {
	case s.nudge <- struct{}{}:
	default:
	}
}

// NudgeOrder wakes only the worker whose share holds the order's emails,
// after ledger rows for that order committed: the others would each spend
// a claim to find nothing (and, with a backlog in other shares, read past
// it to learn so). An id that is not a UUID wakes every worker.
func (s *Sender) NudgeOrder(orderID string) {
	id, err := uuid.Parse(orderID)
	if err != nil {
		s.Nudge()
		return
	}
	// The claim's share: get_byte(uuid_send(order_id), 15) % workers.
	select {
	case s.wake[int(id[15])%len(s.wake)] <- struct{}{}:
	default: // already due to start again
	}
}

// Run sends until ctx is cancelled. A send in progress when ctx ends is
// finished (it is bounded by the mailer's timeout) and its result recorded.
//
// Each worker drains its share of the ledger and then waits to be woken, on
// its own: after a Nudge or a poll every idle worker starts again at once,
// after a NudgeOrder the one whose share holds the order, whatever the
// others are doing. (Had the workers waited for each other
// after each drain, a steady stream would keep one worker busy while the
// ones whose shares ran dry sat idle, their new rows waiting: with eight
// workers, about one worker's throughput.) Stale emails are skipped, as
// one statement, before every worker is woken; between those, the claim
// refuses a stale email on its own.
//
// Abandoned sends are swept on a timer of their own (SweepInterval): a
// row left 'sending' by a dead instance must become unknown (and alert)
// within about the sending timeout, however busy the workers are.
func (s *Sender) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { s.sweepLoop(ctx) })
	wg.Go(func() {
		s.findFloor(ctx)
		s.floorLoop(ctx)
	})
	for worker, wake := range s.wake {
		wg.Go(func() { s.work(ctx, worker, wake) })
	}
	t := time.NewTicker(s.cfg.PollInterval)
	defer t.Stop()
	for {
		if err := s.skipStale(ctx); err != nil && ctx.Err() == nil {
			s.log.ErrorContext(ctx, "email sender: stale-email skip failed; the claim still refuses a stale email", slog.String("error", err.Error()))
		}
		for _, w := range s.wake {
			select {
			case w <- struct{}{}:
			default: // already due to start again
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

// work drains the worker's share each time it is woken, until ctx ends.
func (s *Sender) work(ctx context.Context, worker int, wake <-chan struct{}) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-wake:
		}
		if _, err := s.drain(ctx, worker); err != nil && ctx.Err() == nil {
			s.log.ErrorContext(ctx, "email sender: worker failed; retrying at the next nudge or poll",
				slog.Int("worker", worker), slog.String("error", err.Error()))
		}
	}
}

// SweepInterval is how often Run looks for abandoned sends: a quarter of
// the sending timeout, so a row is declared unknown at most a quarter of
// the timeout late, but not more often than every 100ms (a test's short
// timeout) nor less often than every minute (a long one).
func (s *Sender) SweepInterval() time.Duration {
	return min(max(s.cfg.SendingTimeout/4, 100*time.Millisecond), time.Minute)
}

// sweepLoop runs the stuck-send sweep at once and then every SweepInterval
// until ctx ends. The sweep is one indexed UPDATE of the few 'sending'
// rows; several instances sweeping at once agree, since a row is turned
// only while it is still 'sending'.
func (s *Sender) sweepLoop(ctx context.Context) {
	t := time.NewTicker(s.SweepInterval())
	defer t.Stop()
	for {
		if err := s.sweepStuck(ctx); err != nil && ctx.Err() == nil {
			s.log.ErrorContext(ctx, "email sender: stuck-send sweep failed; retrying at the next interval", slog.String("error", err.Error()))
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// floorLoop waits pendingFloorEvery, finds the claims' floor, and repeats
// until ctx ends.
func (s *Sender) floorLoop(ctx context.Context) {
	t := time.NewTicker(pendingFloorEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.findFloor(ctx)
	}
}

// findFloor sets where the claims' pending branch starts
// (EmailSendPendingFloor). If it cannot, claims start at the beginning of
// the index until the next search: slower, never wrong. The first failure
// of a run of them is logged, and the first success after it: while the
// database is away the search fails every second, and the claims report
// the outage themselves.
func (s *Sender) findFloor(ctx context.Context) {
	floor, err := notifydb.New(indexOrder{db: s.pool}).EmailSendPendingFloor(ctx, s.floorLag.Seconds())
	switch {
	case err != nil:
		floor = time.Time{}
		if ctx.Err() == nil && !s.floorFailing.Swap(true) {
			s.log.WarnContext(ctx, "email sender: cannot find where claims start; claiming from the beginning of the index until a search succeeds",
				slog.String("error", err.Error()))
		}
	case s.floorFailing.Swap(false):
		s.log.InfoContext(ctx, "email sender: found where claims start again")
	}
	s.floor.Store(&floor)
}

// pendingFloor is the floor the claims use now.
func (s *Sender) pendingFloor() time.Time {
	if f := s.floor.Load(); f != nil {
		return *f
	}
	return time.Time{}
}

// RunOnce does one pass over the ledger: it turns abandoned sends into
// unknown (as Run's timer also does while the pass lasts), skips emails
// that became stale before they could be sent, then sends due rows one
// claim at a time, Workers at once, until none is due or ctx ends. It
// returns how many rows it sent (whatever their outcome).
func (s *Sender) RunOnce(ctx context.Context) (int, error) {
	if err := s.sweepStuck(ctx); err != nil {
		return 0, err
	}
	if err := s.skipStale(ctx); err != nil {
		return 0, err
	}
	// The claims' floor, found now and again every second while the pass
	// lasts, as Run does.
	s.findFloor(ctx)
	fctx, stopFloor := context.WithCancel(ctx)
	var floorDone sync.WaitGroup
	floorDone.Go(func() { s.floorLoop(fctx) })
	defer floorDone.Wait()
	defer stopFloor()
	// Workers claim and send until none finds a due row; the first error
	// ends this pass for all of them.
	var (
		sent     atomic.Int64
		mu       sync.Mutex
		firstErr error
		wg       sync.WaitGroup
	)
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	for worker := range s.cfg.Workers {
		wg.Go(func() {
			n, err := s.drain(wctx, worker)
			sent.Add(int64(n))
			if err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
				stop()
			}
		})
	}
	wg.Wait()
	return int(sent.Load()), firstErr
}

// drain claims and sends the worker's due rows until none is left, ctx
// ends or a claim fails, and returns how many it sent (whatever their
// outcome).
func (s *Sender) drain(ctx context.Context, worker int) (int, error) {
	// done is the last send's result, not yet in its ledger row: it is
	// written in the transaction that claims the next row, so a backlog
	// costs one commit per email instead of two.
	var done *outcome
	defer func() {
		if done != nil {
			s.record(context.WithoutCancel(ctx), *done)
		}
	}()
	n := 0
	for ctx.Err() == nil {
		sent, next, err := s.sendNext(ctx, worker, done)
		done = next
		if sent {
			n++
		}
		if err != nil || !sent {
			return n, err
		}
	}
	return n, nil
}

// sendNext writes done, the previous send's result (nil if none), claims
// one due row in the same transaction, and sends it. It reports false when
// nothing was due, and returns the new send's result for the caller to
// pass to the next call: the result is written by then whatever happens,
// in the claim's transaction or on its own.
func (s *Sender) sendNext(ctx context.Context, worker int, done *outcome) (bool, *outcome, error) {
	token := uuid.New()
	// The claim does not follow ctx: cancelled mid-statement, pgx would
	// drop the connection without knowing whether the server committed, and
	// a committed claim would be left 'sending' with no sender, to become
	// 'unknown' later although nothing was sent. Once it returns, a
	// stopping sender gives the row back instead of starting the send.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	row, found, err := s.claim(cctx, notifydb.EmailSendClaimOneParams{
		ClaimToken: token, ClaimedBy: s.cfg.Owner, ResendUnknown: s.cfg.Policy == PolicyResend, PendingFloor: s.pendingFloor(),
		MaxAttempts: int32(s.cfg.MaxAttempts), Workers: int32(s.cfg.Workers), Worker: int32(worker),
	}, done)
	if err != nil {
		return false, nil, fmt.Errorf("claim email: %w", err)
	}
	if !found {
		return false, nil, nil
	}
	bg := context.WithoutCancel(ctx)
	if ctx.Err() != nil {
		s.release(bg, token, row)
		return false, nil, nil
	}
	if row.Attempts == 1 && row.EventTime != nil && time.Since(*row.EventTime) > s.cfg.MaxAge {
		// First chance to send, and already too old: the same rule as
		// skipStale, for a row written after this pass began.
		if _, err := notifydb.New(s.pool).EmailSendMarkSkipped(bg, notifydb.EmailSendMarkSkippedParams{
			SkipReason: SkipStale, OperationKey: row.OperationKey, ClaimToken: token,
		}); err != nil {
			return false, nil, fmt.Errorf("skip stale email: %w", err)
		}
		s.metrics.Emails.WithLabelValues(ResultSkipped).Inc()
		s.log.WarnContext(ctx, "email skipped: its event was older than EMAIL_MAX_AGE before it could be sent",
			slog.String("event_id", row.EventID.String()), slog.String("event_type", row.EventType), slog.Duration("max_age", s.cfg.MaxAge))
		return true, nil, nil
	}
	// Results are recorded even while stopping: a sent email must end up
	// 'sent', never left for the sweep to call unknown.
	result := s.send(bg, token, row)
	return true, &result, nil
}

// claim claims the next due row of the worker's share and, when done is
// not nil, writes that result in the same implicit transaction and round
// trip: the result's update, then the claim, in one pipeline.
//
// Folding the previous result into the claim is safe in every crash
// window: the transaction commits both or neither. If it never commits,
// the previous row stays 'sending' and the new one 'pending'; the previous
// result is then written on its own (record, with its retries), and if the
// process dies before that, the stuck-send sweep makes the previous row
// unknown, which is all that is then known about it. Either way at most
// one row per worker is 'sending' without a sender, as with a claim of its
// own. The commit waits for the WAL flush (synchronous_commit as
// configured): the claim must be durable before the send begins, or a
// database crash could hand the same row out again with nothing to say
// that it was already sent (docs/architecture.md, "The send ledger's
// commits").
func (s *Sender) claim(ctx context.Context, p notifydb.EmailSendClaimOneParams, done *outcome) (notifydb.EmailSend, bool, error) {
	db := indexOrder{db: s.pool}
	if done != nil {
		db.first = &deferred{}
		if _, err := done.update(ctx, notifydb.New(db.first)); err != nil {
			return notifydb.EmailSend{}, false, err // only a deferred statement's own refusal
		}
	}
	row, err := notifydb.New(db).EmailSendClaimOne(ctx, p)
	found := err == nil
	if errors.Is(err, pgx.ErrNoRows) {
		err = nil // nothing due; the result, if any, still committed
	}
	if err != nil && done != nil {
		// Neither committed (or the commit's answer was lost, which
		// record's read-back sorts out): the result goes on its own, with
		// retries, before anything else is claimed.
		s.record(context.WithoutCancel(ctx), *done)
		return s.claim(ctx, p, nil)
	}
	if err != nil {
		return row, false, err
	}
	if done != nil && db.first.tag.RowsAffected() == 0 {
		// The result committed as far as it could; the read-back only
		// explains why it matched nothing, so its own failure changes
		// nothing.
		_ = s.lostClaim(ctx, s.pool, *done)
	}
	return row, found, nil
}

func (s *Sender) send(ctx context.Context, token uuid.UUID, row notifydb.EmailSend) outcome {
	// The span continues the trace of the event that asked for the email;
	// every log line below carries its ids.
	ctx, span := s.startSend(ctx, row)
	defer span.End()
	log := s.log.With(slog.String("event_id", row.EventID.String()), slog.String("operation_key", row.OperationKey),
		slog.String("order_id", row.OrderID.String()), slog.String("event_type", row.EventType), slog.Int("attempt", int(row.Attempts)))
	if row.LastErrorClass != nil && (*row.LastErrorClass == "unknown" || *row.LastErrorClass == "sending_timeout") {
		s.metrics.Resends.Inc()
		log.WarnContext(ctx, "email sender: resending an email whose outcome was unknown, with the same Message-ID",
			slog.String("message_id", row.MessageID))
	}
	reply, err := s.mailer.Send(ctx, s.cfg.From, row.Recipient, buildMessage(s.cfg.From, row))

	exhausted := int(row.Attempts) >= s.cfg.MaxAttempts
	var result, want string
	var update func(context.Context, *notifydb.Queries) (int64, error)
	switch {
	case err == nil:
		result, want = ResultSent, StateSent
		update = func(ctx context.Context, q *notifydb.Queries) (int64, error) {
			return q.EmailSendMarkSent(ctx, notifydb.EmailSendMarkSentParams{SMTPReply: reply, OperationKey: row.OperationKey, ClaimToken: token})
		}
		log.InfoContext(ctx, "email sent", slog.String("message_id", row.MessageID))
	case errors.Is(err, ErrUnknownOutcome) && !(s.cfg.Policy == PolicyResend && exhausted):
		result, want = ResultUnknown, StateUnknown
		update = func(ctx context.Context, q *notifydb.Queries) (int64, error) {
			return q.EmailSendMarkUnknown(ctx, notifydb.EmailSendMarkUnknownParams{
				BackoffSeconds: s.backoff(row.Attempts).Seconds(), ErrorClass: "unknown", LastError: err.Error(),
				OperationKey: row.OperationKey, ClaimToken: token,
			})
		}
		if s.cfg.Policy == PolicyHold {
			log.ErrorContext(ctx, "email outcome unknown: held for an operator, not resent automatically (EMAIL_UNKNOWN_POLICY=hold)",
				slog.String("error", err.Error()))
		} else {
			log.WarnContext(ctx, "email outcome unknown: will resend with the same Message-ID (EMAIL_UNKNOWN_POLICY=resend)",
				slog.String("error", err.Error()))
		}
	case errors.Is(err, ErrTransient) && !exhausted:
		result, want = ResultTransient, StatePending
		delay := s.backoff(row.Attempts)
		update = func(ctx context.Context, q *notifydb.Queries) (int64, error) {
			return q.EmailSendMarkRetry(ctx, notifydb.EmailSendMarkRetryParams{
				BackoffSeconds: delay.Seconds(), ErrorClass: "transient", LastError: err.Error(),
				OperationKey: row.OperationKey, ClaimToken: token,
			})
		}
		log.WarnContext(ctx, "email send failed transiently; will retry", slog.String("error", err.Error()), slog.Duration("retry_in", delay))
	default:
		result, want = ResultFailed, StateFailed
		class := "permanent"
		switch {
		case errors.Is(err, ErrUnknownOutcome):
			// Under the resend policy the attempts are used up: an operator
			// decides (and an alert says so) rather than the row sitting in
			// unknown with nothing but a gauge.
			class = "unknown_attempts_exhausted"
		case !errors.Is(err, ErrPermanent):
			class = "attempts_exhausted"
		}
		update = func(ctx context.Context, q *notifydb.Queries) (int64, error) {
			return q.EmailSendMarkFailed(ctx, notifydb.EmailSendMarkFailedParams{
				ErrorClass: class, LastError: err.Error(), OperationKey: row.OperationKey, ClaimToken: token,
			})
		}
		log.ErrorContext(ctx, "email send failed; parked for an operator", slog.String("error_class", class), slog.String("error", err.Error()))
	}
	s.metrics.Emails.WithLabelValues(result).Inc()
	span.SetAttributes(attribute.String("email.result", result))
	if err != nil {
		failSpan(span, err)
	}
	return outcome{ctx: ctx, log: log, key: row.OperationKey, result: result, want: want, update: update}
}

// outcome is a send's result on its way into the ledger row: an update
// fenced by the claim token, run by claim in the next claim's transaction
// or by record on its own.
type outcome struct {
	ctx          context.Context // the send's span, for the log lines
	log          *slog.Logger    // carries the email's ids
	key          string          // the row's operation key
	result, want string          // the metric's result and the state the update sets
	update       func(context.Context, *notifydb.Queries) (int64, error)
}

// write runs o's update on db. An update that matches nothing is read
// back (lostClaim), since an earlier attempt may have committed without
// its answer arriving.
func (s *Sender) write(ctx context.Context, db notifydb.DBTX, o outcome) error {
	n, err := o.update(ctx, notifydb.New(db))
	if err != nil || n > 0 {
		return err
	}
	return s.lostClaim(ctx, db, o)
}

// lostClaim reads back the row of a result whose update matched nothing,
// and logs if it is not in the state the update sets: its claim was lost
// (the sweep judged it, or an operator resolved it) before the result
// arrived.
func (s *Sender) lostClaim(ctx context.Context, db notifydb.DBTX, o outcome) error {
	row, err := notifydb.New(db).EmailSendGet(ctx, o.key)
	if err == nil && row.State != o.want {
		o.log.WarnContext(o.ctx, "email sender: claim lost before the result was recorded",
			slog.String("result", o.result), slog.String("state", row.State))
	}
	return err
}

// record writes a send's result on its own, retrying with capped backoff
// while the database is unreachable: an email that was sent must end up
// 'sent', or an operator reading 'unknown' could choose to resend it. The
// update is fenced by the claim token (see write). Retrying stops at half
// the sending timeout, when the sweep is about to judge the row anyway; a
// late 'sent' still overrides the sweep's unknown.
func (s *Sender) record(ctx context.Context, o outcome) {
	log := o.log
	deadline := time.Now().Add(s.cfg.SendingTimeout / 2)
	delay := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		dbctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := s.write(dbctx, s.pool, o)
		cancel()
		switch {
		case err == nil:
			if attempt > 1 {
				log.InfoContext(o.ctx, "email sender: result recorded after retries", slog.String("result", o.result), slog.Int("attempts", attempt))
			}
			return
		case !inbox.IsTransient(err) || time.Now().Add(delay).After(deadline):
			// The row stays 'sending'; the stuck sweep turns it into
			// unknown, which is exactly what is known about it now.
			log.ErrorContext(o.ctx, "email sender: could not record the send result", slog.String("result", o.result),
				slog.String("error", err.Error()), slog.Int("attempts", attempt))
			return
		}
		time.Sleep(delay)
		delay = min(2*delay, 5*time.Second)
	}
}

func (s *Sender) release(ctx context.Context, token uuid.UUID, row notifydb.EmailSend) {
	if _, err := notifydb.New(s.pool).EmailSendRelease(ctx, notifydb.EmailSendReleaseParams{OperationKey: row.OperationKey, ClaimToken: token}); err != nil {
		s.log.ErrorContext(ctx, "email sender: release of an unsent claim failed; the sweep will mark it unknown",
			slog.String("operation_key", row.OperationKey), slog.String("error", err.Error()))
	}
}

// sweepStuck turns rows left 'sending' by a dead sender into unknown (or
// failed, when the resend policy has used up the attempts).
func (s *Sender) sweepStuck(ctx context.Context) error {
	rows, err := notifydb.New(s.pool).EmailSendSweepStuck(ctx, notifydb.EmailSendSweepStuckParams{
		ResendUnknown: s.cfg.Policy == PolicyResend, MaxAttempts: int32(s.cfg.MaxAttempts), TimeoutSeconds: s.cfg.SendingTimeout.Seconds(),
	})
	if err != nil {
		return fmt.Errorf("sweep stuck sends: %w", err)
	}
	for _, r := range rows {
		s.metrics.Emails.WithLabelValues(r.State).Inc()
		s.log.ErrorContext(ctx, "email stuck in sending past the timeout: outcome unknown, not resent silently",
			slog.String("event_id", r.EventID.String()), slog.String("operation_key", r.OperationKey), slog.String("state", r.State),
			slog.Duration("sending_timeout", s.cfg.SendingTimeout), slog.String("policy", string(s.cfg.Policy)))
	}
	return nil
}

// skipStale skips the emails whose events are older than MaxAge and that
// were never attempted (C4a): counted, logged once per pass, never sent.
func (s *Sender) skipStale(ctx context.Context) error {
	rows, err := notifydb.New(s.pool).EmailSendSkipStale(ctx, s.cfg.MaxAge.Seconds())
	if err != nil {
		return fmt.Errorf("skip stale emails: %w", err)
	}
	if len(rows) == 0 {
		return nil
	}
	s.metrics.Emails.WithLabelValues(ResultSkipped).Add(float64(len(rows)))
	first := rows[0]
	s.log.WarnContext(ctx, "emails skipped: their events were older than EMAIL_MAX_AGE before they could be sent",
		slog.Int("skipped", len(rows)), slog.Duration("max_age", s.cfg.MaxAge),
		slog.String("sample_event_id", first.EventID.String()), slog.String("sample_event_type", first.EventType))
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

// indexOrder runs each statement of the generated queries with sorting
// discouraged: in one round trip, a set_config of enable_sort = off (and
// jit = off, see preferIndexOrder) local to the statement's transaction (a pipeline up to its Sync is one implicit
// transaction), then the statement itself. The sender's claim and the
// ledger cleanup go through it, so that the plan that walks their index in
// the ORDER BY's order (email_send_pending_due_idx and the others) is the
// one taken whatever the planner's statistics say.
//
// The index alone is not enough. Statistics taken before a backlog say
// that almost no row is pending; the planner then expects the claim to
// find one row at most, and to it reading that row through the index in
// order or fetching "all" matching rows with a bitmap scan and sorting
// them costs the same, and the bitmap scan is a little cheaper. On the
// real backlog that plan reads and sorts every due row to send one email.
// With sorting discouraged, the walk in index order is the only plan left
// that does not sort; where a sort cannot be avoided the planner still
// sorts, so no statement fails for it.
type indexOrder struct {
	db interface {
		SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	}
	// first, if set, is sent ahead of the set_config in the same round trip
	// and implicit transaction: the sender's previous result, written with
	// its next claim. Its command tag is stored in it.
	first *deferred
}

// deferred is a DBTX that runs nothing: it keeps the one statement a
// generated query hands it (an :execrows update), for indexOrder to send
// ahead of its own.
type deferred struct {
	sql  string
	args []any
	tag  pgconn.CommandTag // set by indexOrder once the statement ran
}

func (d *deferred) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	d.sql, d.args = sql, args
	return pgconn.CommandTag{}, nil
}

func (d *deferred) Query(context.Context, string, ...any) (pgx.Rows, error) {
	return nil, errors.New("deferred: only a statement without rows can be sent ahead")
}

func (d *deferred) QueryRow(context.Context, string, ...any) pgx.Row {
	return errRow{errors.New("deferred: only a statement without rows can be sent ahead")}
}

// preferIndexOrder is sent before each statement indexOrder runs. The
// planner discourages a sort by adding a huge constant to its cost, which
// puts every plan that keeps one (the claim's merge of its two candidates)
// far above jit_above_cost: JIT is turned off with it, or each claim would
// be compiled first (170ms, measured, for a statement that takes 1ms).
const preferIndexOrder = "SELECT set_config('enable_sort', 'off', true), set_config('jit', 'off', true)"

func (d indexOrder) send(ctx context.Context, sql string, args []any) (pgx.BatchResults, error) {
	b := &pgx.Batch{}
	if d.first != nil {
		b.Queue(d.first.sql, d.first.args...)
	}
	b.Queue(preferIndexOrder)
	b.Queue(sql, args...)
	br := d.db.SendBatch(ctx, b)
	if d.first != nil {
		tag, err := br.Exec()
		if err != nil {
			_ = br.Close()
			return nil, err
		}
		d.first.tag = tag
	}
	if _, err := br.Exec(); err != nil {
		_ = br.Close()
		return nil, err
	}
	return br, nil
}

// Exec runs a statement that returns no rows.
func (d indexOrder) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	br, err := d.send(ctx, sql, args)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := br.Exec()
	return tag, errors.Join(err, br.Close())
}

// Query runs a statement that returns rows; closing them ends the batch.
func (d indexOrder) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	br, err := d.send(ctx, sql, args)
	if err != nil {
		return nil, err
	}
	rows, err := br.Query()
	if err != nil {
		_ = br.Close()
		return nil, err
	}
	return batchRows{Rows: rows, br: br}, nil
}

// QueryRow runs a statement that returns at most one row.
func (d indexOrder) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	br, err := d.send(ctx, sql, args)
	if err != nil {
		return errRow{err}
	}
	return batchRow{row: br.QueryRow(), br: br}
}

type batchRows struct {
	pgx.Rows
	br pgx.BatchResults
}

func (r batchRows) Close() {
	r.Rows.Close()
	_ = r.br.Close()
}

type batchRow struct {
	row pgx.Row
	br  pgx.BatchResults
}

func (r batchRow) Scan(dest ...any) error {
	err := r.row.Scan(dest...)
	if cerr := r.br.Close(); err == nil {
		err = cerr
	}
	return err
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }
