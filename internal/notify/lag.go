package notify

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// watchLag reads the group's lag from the broker every LagInterval: the
// end offset of each partition against the group's committed offset. It
// does not depend on fetches, so a consumer that fetches nothing, because
// it is stuck or paused, still shows a lag that grows as the producer
// writes. A partition with a lag whose committed offset has not moved for
// StallAfter is reported as stalled (metric and /readyz information).
func (c *Consumer) watchLag(ctx context.Context, cl *kgo.Client) {
	adm := kadm.NewClient(cl)
	t := time.NewTicker(c.cfg.LagInterval)
	defer t.Stop()
	for {
		c.readLag(ctx, adm)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (c *Consumer) readLag(ctx context.Context, adm *kadm.Client) {
	lctx, cancel := context.WithTimeout(ctx, max(c.cfg.LagInterval, time.Second))
	defer cancel()
	lags, err := adm.Lag(lctx, c.cfg.Group)
	var gl kadm.DescribedGroupLag
	if err == nil {
		var ok bool
		if gl, ok = lags[c.cfg.Group]; !ok {
			err = fmt.Errorf("group %s not described", c.cfg.Group)
		} else {
			err = gl.Error()
		}
	}
	if err != nil {
		if ctx.Err() == nil {
			c.log.DebugContext(ctx, "read consumer lag", slog.String("error", err.Error()))
		}
		return
	}
	now := time.Now()
	var stalled []string
	c.mu.Lock()
	for p, l := range gl.Lag[c.cfg.Topic] {
		if l.Err != nil || l.Lag < 0 {
			continue
		}
		c.metrics.ConsumerLag.WithLabelValues(c.cfg.Topic, strconv.Itoa(int(p))).Set(float64(l.Lag))
		tp := topicPartition{c.cfg.Topic, p}
		prev, seen := c.health.lastCommit[tp]
		if !seen || prev.offset != l.Commit.At {
			prev = progress{offset: l.Commit.At, since: now}
			c.health.lastCommit[tp] = prev
		}
		if l.Lag > 0 && now.Sub(prev.since) >= c.cfg.StallAfter {
			stalled = append(stalled, fmt.Sprintf("%s (lag %d, committed offset %d unchanged for %s)",
				tp, l.Lag, l.Commit.At, now.Sub(prev.since).Round(time.Second)))
		}
	}
	slices.Sort(stalled)
	c.health.stalled = stalled
	c.mu.Unlock()
	c.metrics.StalledPartitions.Set(float64(len(stalled)))
}
