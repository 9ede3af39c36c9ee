-- The sweeper ends work past its deadline every few seconds; through this
-- index each pass reads the overdue rows alone, not the whole backlog of
-- unfinished work sorted by deadline.
CREATE INDEX work_open_deadline ON work (deadline_at) WHERE state IN ('queued', 'running');
