-- A diff too large for one model call is reviewed in parts under one
-- lease. The attempt the claim made stands for the lease (its outcome is
-- the work's verdict on this try) and makes no call of its own: it is
-- marked part = '*'. Each call is a row of its own with the lease's token
-- and number, its part's id (p1, p2, …) and its place among the lease's
-- calls (call 1, 2, …), its outcome, raw answer, reservation and ATTEMPT
-- event, so model calls, attempt rows with a call and ledger rows stay one
-- to one. The claim's fences (one attempt per lease, one per number) hold
-- as before for the claimed attempts, whose call is NULL.
ALTER TABLE attempts
    ADD COLUMN part text,
    ADD COLUMN call smallint CHECK (call > 0),
    -- answer is what the committer gates when it is not the raw response
    -- (a reviewed-in-parts attempt's merged findings); coverage says what
    -- the parts covered, and what not, for the check run.
    ADD COLUMN answer bytea,
    ADD COLUMN coverage jsonb;

ALTER TABLE attempts DROP CONSTRAINT attempts_claim,
    ADD CONSTRAINT attempts_claim UNIQUE NULLS NOT DISTINCT (work_id, lease_token, call);
ALTER TABLE attempts DROP CONSTRAINT attempts_number,
    ADD CONSTRAINT attempts_number UNIQUE NULLS NOT DISTINCT (work_id, number, call);
