-- A pull request's findings are published as one review that carries every
-- comment. review_id is the last review made for the work.
--
-- steps says which steps of a publication to GitHub are complete, and for
-- which outcome: step -> outcome, the steps being 'check_run' (made or
-- edited to the outcome's content), 'review' (every finding on the pull
-- request: new ones in one review, existing ones edited), 'comment:<key>'
-- (an existing finding's comment edited) and 'rerun' (the conversation
-- comment). A retry skips a step complete for the row's outcome, so a
-- failed call does not send again what succeeded before it; a step
-- recorded for another outcome counts for nothing, and a row opened for a
-- new outcome of the work starts with none.
ALTER TABLE publications
    ADD COLUMN review_id bigint,
    ADD COLUMN steps jsonb NOT NULL DEFAULT '{}';
