-- +goose Up
-- Orders: the business aggregate. `version` is the optimistic-concurrency
-- token exposed as the ETag; every command bumps it inside the same
-- transaction that writes its outbox rows (W1).
CREATE TABLE orders (
    id          uuid        PRIMARY KEY,
    customer    text        NOT NULL,
    email       text        NOT NULL,
    currency    text        NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    status      text        NOT NULL CHECK (status IN ('placed', 'paid', 'shipped', 'cancelled')),
    total_cents bigint      NOT NULL CHECK (total_cents >= 0),
    version     bigint      NOT NULL CHECK (version >= 1),
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL
);

-- Serves "my orders, newest first" with keyset pagination.
CREATE INDEX orders_customer_created_idx ON orders (customer, created_at DESC, id DESC);

CREATE TABLE order_lines (
    order_id         uuid    NOT NULL REFERENCES orders (id) ON DELETE CASCADE,
    line_no          integer NOT NULL CHECK (line_no >= 1),
    sku              text    NOT NULL,
    quantity         integer NOT NULL CHECK (quantity > 0),
    unit_price_cents bigint  NOT NULL CHECK (unit_price_cents >= 0),
    PRIMARY KEY (order_id, line_no)
);

-- Idempotency-Key on create (S3), scoped to the customer. The request hash
-- tells a retry (same body) from a misuse of the key (different body).
CREATE TABLE idempotency_keys (
    customer     text        NOT NULL,
    key          text        NOT NULL,
    request_hash bytea       NOT NULL,
    order_id     uuid        NOT NULL REFERENCES orders (id) ON DELETE CASCADE,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (customer, key)
);
