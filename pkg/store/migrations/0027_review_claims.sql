-- A person opening a review item from the console claims it until
-- claimed_until, so two people never hold the same item; a claim past its
-- time is nobody's. A resolution is refused while another person's claim
-- holds.
ALTER TABLE reviews
    ADD COLUMN claimed_by    text,
    ADD COLUMN claimed_until timestamptz,
    -- The answer as a person resolved it from the console: the model's,
    -- accepted as it was (approved), or with the person's findings
    -- (amended). It passed the contract's gate, and it is what the work's
    -- 'reviewed' outcome publishes, once.
    ADD COLUMN output        jsonb;
ALTER TABLE reviews DROP CONSTRAINT reviews_verdict_check;
ALTER TABLE reviews ADD CONSTRAINT reviews_verdict_check
    CHECK (verdict IN ('approved', 'amended', 'rejected', 'dismissed'));
ALTER TABLE reviews ADD CONSTRAINT reviews_output_verdict
    CHECK (output IS NULL OR verdict IN ('approved', 'amended'));
CREATE INDEX reviews_open_created ON reviews (created_at, work_id) WHERE state = 'open';
