-- A review item whose work is settled by another ending is closed by the
-- system, so the queue lists only what a person can act on: redriven work
-- that ends accepted (an answer that asks for nobody), superseded or
-- canceled closes its open item, verdict 'closed', resolver kind and route
-- 'system', and a note that says why. Redriven work that ends accepted
-- with an answer that asks for a person keeps its item open, for that
-- reason.
ALTER TABLE reviews DROP CONSTRAINT reviews_verdict_check;
ALTER TABLE reviews ADD CONSTRAINT reviews_verdict_check
    CHECK (verdict IN ('approved', 'amended', 'rejected', 'dismissed', 'closed'));
ALTER TABLE reviews DROP CONSTRAINT reviews_resolved_kind_check;
ALTER TABLE reviews ADD CONSTRAINT reviews_resolved_kind_check
    CHECK (resolved_kind IN ('tenant', 'reviewer', 'operator', 'system'));
ALTER TABLE reviews DROP CONSTRAINT reviews_resolved_route_check;
ALTER TABLE reviews ADD CONSTRAINT reviews_resolved_route_check
    CHECK (resolved_route IN ('api', 'console', 'system'));
-- Only the system closes, and the system only closes.
ALTER TABLE reviews ADD CONSTRAINT reviews_closed_by_system
    CHECK ((verdict IS DISTINCT FROM 'closed' OR resolved_kind = 'system')
        AND (resolved_kind IS DISTINCT FROM 'system' OR verdict = 'closed'));

CREATE FUNCTION review_settled_work() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state = 'accepted' AND EXISTS (SELECT 1 FROM results r
            WHERE r.work_id = NEW.id AND r.output @> '{"needsHumanReview": true}') THEN
        UPDATE reviews SET reason = 'needs_human_review' WHERE work_id = NEW.id AND state = 'open';
        RETURN NULL;
    END IF;
    UPDATE reviews SET state = 'resolved', verdict = 'closed', resolved_by = 'assay', resolved_kind = 'system',
        resolved_route = 'system', resolved_at = now(), claimed_by = NULL, claimed_kind = NULL, claimed_until = NULL,
        note = CASE NEW.state WHEN 'accepted' THEN 'the work was redriven and its answer was accepted'
            ELSE 'the work ended ' || NEW.state || coalesce(' (' || nullif(NEW.reason, '') || ')', '') END
    WHERE work_id = NEW.id AND state = 'open';
    RETURN NULL;
END
$$;
-- Work with a review item was redriven before it could end again, and a
-- redrive counts a dispatch: first-time work pays the WHEN test alone.
CREATE TRIGGER work_settles_review AFTER UPDATE OF state ON work FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state AND NEW.dispatch > 1
        AND NEW.state IN ('accepted', 'superseded', 'canceled'))
    EXECUTE FUNCTION review_settled_work();

-- Items left open by work settled before this migration.
UPDATE reviews v SET reason = 'needs_human_review'
FROM work w JOIN results r ON r.work_id = w.id
WHERE v.work_id = w.id AND v.state = 'open' AND w.state = 'accepted' AND r.output @> '{"needsHumanReview": true}';
UPDATE reviews v SET state = 'resolved', verdict = 'closed', resolved_by = 'assay', resolved_kind = 'system',
    resolved_route = 'system', resolved_at = now(), claimed_by = NULL, claimed_kind = NULL, claimed_until = NULL,
    note = CASE w.state WHEN 'accepted' THEN 'the work was redriven and its answer was accepted'
        ELSE 'the work ended ' || w.state || coalesce(' (' || nullif(w.reason, '') || ')', '') END
FROM work w
WHERE v.work_id = w.id AND v.state = 'open' AND v.reason <> 'needs_human_review'
    AND w.state IN ('accepted', 'superseded', 'canceled');
