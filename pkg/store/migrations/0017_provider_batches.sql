-- Batch-lane attempts sent through the provider's Batch API. A line is one
-- claimed attempt, held under a lease as long as the batch may take; it is
-- written with the claim's lease extended, so a worker that dies after
-- claiming leaves a line another worker sends. A batch row is written
-- before anything reaches the provider and names the provider's batch once
-- it exists, so a restart polls it again instead of sending it twice; its
-- metadata carries the row's id, so a creation whose answer was lost is
-- found again. Each line is reconciled once, by its attempt id (the
-- custom_id), in the transaction that records its attempt.
CREATE TABLE provider_batches (
    id                uuid PRIMARY KEY,
    state             text NOT NULL DEFAULT 'preparing' CHECK (state IN ('preparing', 'submitted', 'reconciled')),
    lines             int NOT NULL,
    input_file_id     text,
    provider_batch_id text UNIQUE,
    -- the provider's status, and what it said of a batch that failed
    status            text,
    errors            text,
    output_file_id    text,
    error_file_id     text,
    request_total     int NOT NULL DEFAULT 0,
    request_completed int NOT NULL DEFAULT 0,
    request_failed    int NOT NULL DEFAULT 0,
    -- how its lines were reconciled
    answered          int NOT NULL DEFAULT 0,
    failed            int NOT NULL DEFAULT 0,
    expired           int NOT NULL DEFAULT 0,
    missing           int NOT NULL DEFAULT 0,
    submit_tries      int NOT NULL DEFAULT 0,
    last_error        text,
    -- a worker holds the batch while it submits, polls or reconciles it
    held_until        timestamptz NOT NULL DEFAULT 'epoch',
    next_poll_at      timestamptz NOT NULL DEFAULT now(),
    polls             int NOT NULL DEFAULT 0,
    created_at        timestamptz NOT NULL DEFAULT now(),
    submitted_at      timestamptz,
    ended_at          timestamptz,
    reconciled_at     timestamptz
);
CREATE INDEX provider_batches_open ON provider_batches (next_poll_at) WHERE state <> 'reconciled';

CREATE TABLE provider_batch_lines (
    attempt_id    uuid PRIMARY KEY REFERENCES attempts (id),
    work_id       text NOT NULL,
    tenant_id     text NOT NULL,
    lease_token   uuid NOT NULL,
    batch_id      uuid REFERENCES provider_batches (id),
    -- the chat-completions request body, kept in the cell until the line
    -- is reconciled
    request       bytea,
    state         text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'batched', 'reconciled')),
    -- how the provider answered it: answered, failed, expired, missing,
    -- or unsent (its lease was gone before it was sent)
    outcome       text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    reconciled_at timestamptz
);
CREATE INDEX provider_batch_lines_pending ON provider_batch_lines (created_at) WHERE state = 'pending';
CREATE INDEX provider_batch_lines_batch ON provider_batch_lines (batch_id);
