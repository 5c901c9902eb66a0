-- name: InvoiceInsert :one
-- Issues an invoice at version 1. RETURNING gives the committed values the
-- event payload is built from (W5).
INSERT INTO invoices (id, customer, total_cents)
VALUES (@id, @customer, @total_cents)
RETURNING id, customer, total_cents, status, version, issued_at;

-- name: InvoiceTotalAdd :exec
-- Adds one issued invoice to its customer's ledger line.
INSERT INTO invoice_totals (customer, invoices, total_cents)
VALUES (@customer, 1, @total_cents)
ON CONFLICT (customer) DO UPDATE
SET invoices    = invoice_totals.invoices + 1,
    total_cents = invoice_totals.total_cents + EXCLUDED.total_cents;

-- name: InvoiceTotalGet :one
SELECT customer, invoices, total_cents FROM invoice_totals WHERE customer = @customer;
