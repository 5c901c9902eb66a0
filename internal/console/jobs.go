package console

import (
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/outboxref/orders/internal/notifyapi"
	"github.com/outboxref/orders/internal/outbox/operate"
	"github.com/outboxref/orders/internal/outbox/problem"
)

// job is a bulk action running in the background, for its progress page.
// Its result is in the audit trail; the job itself lives in the process.
type job struct {
	ID          uuid.UUID
	Action      string // "resume" or "repair"
	Fingerprint string
	Actor       string
	Started     time.Time

	mu       sync.Mutex
	progress operate.BulkProgress
	finished bool
	err      string
}

// JobView is a job's state, for its page and its progress fragment.
type JobView struct {
	ID          uuid.UUID
	Action      string
	Fingerprint string
	Actor       string
	Started     time.Time
	Progress    operate.BulkProgress
	Finished    bool
	Error       string
}

func (j *job) view() JobView {
	j.mu.Lock()
	defer j.mu.Unlock()
	return JobView{ID: j.ID, Action: j.Action, Fingerprint: j.Fingerprint, Actor: j.Actor, Started: j.Started,
		Progress: j.progress, Finished: j.finished, Error: j.err}
}

func (j *job) update(p operate.BulkProgress) {
	j.mu.Lock()
	j.progress = p
	j.mu.Unlock()
}

func (j *job) finish(p operate.BulkProgress, err error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.progress, j.finished = p, true
	if err != nil {
		j.err = err.Error()
	}
}

// jobs keeps the bulk actions of the last day.
type jobs struct {
	mu   sync.Mutex
	byID map[uuid.UUID]*job
}

func newJobs() *jobs { return &jobs{byID: map[uuid.UUID]*job{}} }

func (js *jobs) add(action, fingerprint, actor string, total int) *job {
	j := &job{ID: uuid.New(), Action: action, Fingerprint: fingerprint, Actor: actor, Started: time.Now(),
		progress: operate.BulkProgress{Total: total}}
	js.mu.Lock()
	defer js.mu.Unlock()
	for id, old := range js.byID {
		if time.Since(old.Started) > 24*time.Hour {
			delete(js.byID, id)
		}
	}
	js.byID[j.ID] = j
	return j
}

func (js *jobs) get(id uuid.UUID) (*job, bool) {
	js.mu.Lock()
	defer js.mu.Unlock()
	j, ok := js.byID[id]
	return j, ok
}

// statusOf maps an error of the operations, or of the notifier's API, to
// a status and a message for the operator.
func statusOf(err error) (int, string) {
	var prob *problem.Problem
	switch {
	case errors.Is(err, operate.ErrActorRequired), errors.Is(err, operate.ErrNothingToChange),
		errors.Is(err, operate.ErrRepairRefused), errors.Is(err, operate.ErrBadSelector), errors.Is(err, operate.ErrInvalidPublishMode):
		return http.StatusBadRequest, err.Error()
	case errors.Is(err, operate.ErrNotFound):
		return http.StatusNotFound, err.Error()
	case errors.Is(err, operate.ErrNotParked), errors.Is(err, operate.ErrPlanState), errors.Is(err, operate.ErrNeedsApproval),
		errors.Is(err, operate.ErrSameApprover), errors.Is(err, operate.ErrApprovalExpired):
		return http.StatusConflict, err.Error()
	case errors.Is(err, operate.ErrTooManyEvents):
		return http.StatusUnprocessableEntity, err.Error()
	case errors.As(err, &prob) && prob.Status >= 400 && prob.Status < 500:
		return prob.Status, "the notifier says: " + prob.Detail
	case errors.Is(err, errNoNotifier):
		return http.StatusServiceUnavailable, err.Error()
	}
	return http.StatusInternalServerError, "internal error; the service log has the details"
}

var errNoNotifier = errors.New("the notifier is not configured (CONSOLE_NOTIFIER_URL and CONSOLE_NOTIFIER_TOKEN)")

// notifierClient is the notifier's admin API client, or errNoNotifier.
func (c *Console) notifierClient() (*notifyapi.Client, error) {
	if c.cfg.Notifier == nil {
		return nil, errNoNotifier
	}
	return c.cfg.Notifier, nil
}
