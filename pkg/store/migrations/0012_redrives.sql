-- An operator's redrive of work that ended in a failed outcome. The key is
-- the ending it redrove (the work's state and updated_at when it was read):
-- one ending is redriven at most once, so a second redrive of the same
-- selection finds its row and makes no new attempt.
CREATE TABLE redrives (
    work_id     text NOT NULL REFERENCES work (id),
    ended_state text NOT NULL,
    ended_reason text NOT NULL DEFAULT '', -- the work's reason, which the redrive clears
    ended_at    timestamptz NOT NULL,
    dispatch    int NOT NULL,
    redriven_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (work_id, ended_at)
);

CREATE INDEX work_created ON work (created_at, id);
