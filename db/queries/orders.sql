-- name: OrderInsert :one
INSERT INTO orders (id, customer, email, currency, status, total_cents, version, created_at, updated_at)
VALUES (@id, @customer, @email, @currency, 'placed', @total_cents, 1, @now, @now)
RETURNING *;

-- name: OrderLinesInsert :many
-- One round trip for all lines of an order.
INSERT INTO order_lines (order_id, line_no, sku, quantity, unit_price_cents)
SELECT @order_id::uuid, unnest(@line_nos::integer[]), unnest(@skus::text[]),
       unnest(@quantities::integer[]), unnest(@unit_prices_cents::bigint[])
RETURNING *;

-- name: OrderGet :one
SELECT * FROM orders WHERE id = @id;

-- name: OrderLinesList :many
SELECT * FROM order_lines WHERE order_id = @order_id ORDER BY line_no;

-- name: OrderLinesListByOrders :many
SELECT * FROM order_lines WHERE order_id = ANY(@order_ids::uuid[]) ORDER BY order_id, line_no;

-- name: OrderListByCustomer :many
-- Keyset pagination, newest first. The cursor is the (created_at, id) of
-- the last row of the previous page; the first page passes NULLs.
SELECT * FROM orders
WHERE customer = @customer
  AND (sqlc.narg('after_created_at')::timestamptz IS NULL
       OR (created_at, id) < (sqlc.narg('after_created_at')::timestamptz, sqlc.narg('after_id')::uuid))
ORDER BY created_at DESC, id DESC
LIMIT @row_limit;

-- name: OrderUpdateStatus :one
-- The conditional update of W1: it matches no row when another command
-- changed the order first, and the caller turns that into 412.
UPDATE orders
SET status = @status, version = @new_version, updated_at = @now
WHERE id = @id AND version = @expected_version
RETURNING *;

-- name: IdempotencyKeyGet :one
SELECT * FROM idempotency_keys WHERE customer = @customer AND key = @key;

-- name: IdempotencyKeyInsert :exec
INSERT INTO idempotency_keys (customer, key, request_hash, order_id)
VALUES (@customer, @key, @request_hash, @order_id);

-- name: CleanupLock :one
-- One cleanup run at a time across the service's processes (O6).
SELECT pg_try_advisory_lock(@lock_key::bigint);

-- name: CleanupUnlock :one
SELECT pg_advisory_unlock(@lock_key::bigint);

-- name: IdempotencyKeysCleanup :one
-- Deletes one batch of idempotency keys older than the retention, oldest
-- first. A retry that arrives later creates a new order, which is why the
-- retention must exceed how long clients retry.
--
-- It returns how many keys it deleted and the last one's
-- (created_at, customer, key) in the index's order, the cursor the next
-- batch seeks past in idempotency_keys_created_idx: from the start of the
-- index, each batch would first step over the entries of the batches
-- before it, which stay there until the table is vacuumed, and a run over
-- a large backlog would take time quadratic in it. The cutoff is now(), a
-- stable value the index scan can stop at; with clock_timestamp() the
-- run's last batch would read every key still within the retention.
--
-- The batch's rows are deleted by their physical address (ctid), which the
-- planner can only fetch one by one. Matched by (customer, key) instead,
-- with statistics from when the table was small, it hashed the batch and
-- read the whole table to find them, each batch
-- (TestKeyCleanupReadsOnlyItsBatch). A key is never updated, so its ctid
-- holds within the statement; the cleanup's advisory lock keeps a second
-- cleanup from deleting it meanwhile, and a row deleted meanwhile anyway
-- would only be skipped.
WITH gone AS (
    DELETE FROM idempotency_keys
    WHERE ctid = ANY (ARRAY(
        SELECT k.ctid FROM idempotency_keys k
        WHERE k.created_at < now() - make_interval(secs => @retention_seconds::float8)
          AND (k.created_at, k.customer, k.key) > (@after_created_at::timestamptz, @after_customer::text, @after_key::text)
        ORDER BY k.created_at, k.customer, k.key
        LIMIT @batch_size
    ))
    RETURNING created_at, customer, key
), last AS (
    SELECT g.created_at, g.customer, g.key FROM gone g
    ORDER BY g.created_at DESC, g.customer DESC, g.key DESC
    LIMIT 1
)
SELECT (SELECT count(*) FROM gone)::bigint AS deleted,
       coalesce((SELECT l.created_at FROM last l), @after_created_at::timestamptz)::timestamptz AS last_created_at,
       coalesce((SELECT l.customer FROM last l), @after_customer::text)::text AS last_customer,
       coalesce((SELECT l.key FROM last l), @after_key::text)::text AS last_key;
