-- +goose Up
-- The invoicing service's own tables: its own migration line ("invoices",
-- tracked in invoices_migrations). The outbox and inbox tables come from
-- those packages' lines, which the service applies before this one.

-- An invoice, the aggregate whose changes become events. version is the
-- aggregate version the outbox rows carry: 1 when issued, and every later
-- change would bump it in the transaction that writes its event (W4).
CREATE TABLE invoices (
    id          uuid        PRIMARY KEY,
    customer    text        NOT NULL CHECK (customer <> ''),
    total_cents bigint      NOT NULL CHECK (total_cents >= 0),
    status      text        NOT NULL DEFAULT 'issued' CHECK (status IN ('issued')),
    version     bigint      NOT NULL DEFAULT 1 CHECK (version >= 1),
    issued_at   timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- The ledger: what each customer has been invoiced, fed by invoice.issued
-- through the inbox. Its update adds to a running sum, which is not
-- idempotent: an event applied twice would count an invoice twice, and the
-- inbox marker written in the same transaction is what prevents that.
CREATE TABLE invoice_totals (
    customer    text   PRIMARY KEY,
    invoices    bigint NOT NULL CHECK (invoices >= 0),
    total_cents bigint NOT NULL CHECK (total_cents >= 0)
);
