package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Retry timing of EnsureTopic: each attempt gets topicAttemptTimeout, and
// failed attempts are spaced by the relay's jittered backoff between
// topicRetryBase and topicRetryCap, so that many instances starting
// against one unavailable cluster do not come back in step.
const (
	topicAttemptTimeout = 10 * time.Second
	topicRetryBase      = time.Second
	topicRetryCap       = 30 * time.Second
)

// EnsureTopic creates topic with the given number of partitions (and the
// broker's default replication factor) if it does not exist. kafka holds
// the options that reach the cluster, the same as Config.Kafka; EnsureTopic
// builds a client of its own from them and closes it before returning, so
// it never races the relay's producer.
//
// A broker that cannot be reached is retried with capped, jittered backoff
// until the topic exists or ctx ends, so EnsureTopic may take as long as
// the outage. Run it in its own goroutine, next to the relay:
//
//	go relay.EnsureTopic(ctx, kafkaOpts, "billing.events", 6, log)
//
// Start-up must never wait for it (O3): until the topic exists, the relay's
// sends fail as unknown_topic and are retried like any transient failure.
//
// An existing topic is left as it is. A different partition count is only
// logged as a warning: adding partitions would send an aggregate's later
// events to another partition than its earlier ones, breaking their order,
// so changing it is an operator's decision.
//
// EnsureTopic returns nil once the topic exists, an error at once if topic
// or partitions are invalid or the options cannot build a client, and
// ctx's error if ctx ends first. log receives the outcome and each failed
// attempt; slog.Default() when nil.
func EnsureTopic(ctx context.Context, kafka []kgo.Opt, topic string, partitions int, log *slog.Logger) error {
	if topic == "" {
		return errors.New("ensure kafka topic: empty topic name")
	}
	if partitions < 1 || partitions > math.MaxInt32 {
		return fmt.Errorf("ensure kafka topic %q: %d partitions, want 1 or more", topic, partitions)
	}
	if log == nil {
		log = slog.Default()
	}
	cl, err := kgo.NewClient(kafka...)
	if err != nil {
		return fmt.Errorf("ensure kafka topic %q: create client: %w", topic, err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	log = log.With("topic", topic, "partitions", partitions)

	for attempt := 1; ; attempt++ {
		created, existing, err := createTopic(ctx, adm, topic, partitions)
		switch {
		case err == nil && created:
			log.InfoContext(ctx, "kafka topic created")
			return nil
		case err == nil && existing != partitions:
			log.WarnContext(ctx, "kafka topic exists with a different partition count; left unchanged",
				"existing_partitions", existing)
			return nil
		case err == nil:
			log.DebugContext(ctx, "kafka topic exists")
			return nil
		case ctx.Err() != nil:
			return fmt.Errorf("ensure kafka topic %q: %w", topic, ctx.Err())
		}
		delay := backoff(attempt, topicRetryBase, topicRetryCap)
		log.WarnContext(ctx, "create kafka topic failed; retrying in the background",
			"error", err, "attempt", attempt, "retry_in", delay.String())
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("ensure kafka topic %q: %w", topic, ctx.Err())
		case <-t.C:
		}
	}
}

// createTopic makes one attempt. It reports whether it created the topic
// and, if the topic already existed, its partition count; when that count
// cannot be read it reports partitions, as nothing is wrong that a retry
// would fix: the topic is there.
func createTopic(ctx context.Context, adm *kadm.Client, topic string, partitions int) (created bool, existing int, err error) {
	actx, cancel := context.WithTimeout(ctx, topicAttemptTimeout)
	defer cancel()
	// Replication factor -1: the broker's default.replication.factor.
	_, err = adm.CreateTopic(actx, int32(partitions), -1, nil, topic)
	if err == nil {
		return true, partitions, nil
	}
	if !errors.Is(err, kerr.TopicAlreadyExists) {
		return false, 0, err
	}
	td, lerr := adm.ListTopics(actx, topic)
	if lerr != nil || !td.Has(topic) {
		return false, partitions, nil
	}
	return false, len(td[topic].Partitions), nil
}
