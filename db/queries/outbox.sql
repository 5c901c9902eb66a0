-- name: OutboxInsert :exec
-- Inserts all events of one command in one statement, inside the caller's
-- business transaction (W1). created_at and next_attempt_at take their
-- defaults.
INSERT INTO outbox (event_id, aggregate_type, aggregate_id, aggregate_version,
                    event_type, schema_version, payload, traceparent)
SELECT unnest(@event_ids::uuid[]), unnest(@aggregate_types::text[]), unnest(@aggregate_ids::text[]),
       unnest(@aggregate_versions::bigint[]), unnest(@event_types::text[]),
       unnest(@schema_versions::integer[]), unnest(@payloads::jsonb[]),
       -- '' stands for "no traceparent": pgx cannot send NULL inside text[] from []string.
       nullif(unnest(@traceparents::text[]), '');
