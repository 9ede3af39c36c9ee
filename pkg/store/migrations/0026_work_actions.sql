-- An operator token has a role: an operator reads the console and acts on
-- work from it; a reviewer reads it and acts on no work.
ALTER TABLE operator_tokens
    ADD COLUMN role text NOT NULL DEFAULT 'operator' CHECK (role IN ('operator', 'reviewer'));

-- What a person did to a work item from the console, written in the
-- transaction of the action itself: who (the operator token's name), what
-- and when.
CREATE TABLE work_actions (
    id       bigserial PRIMARY KEY,
    work_id  text NOT NULL REFERENCES work (id) ON DELETE CASCADE,
    action   text NOT NULL,
    by_name  text NOT NULL,
    note     text NOT NULL DEFAULT '',
    acted_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX work_actions_work ON work_actions (work_id, id);
