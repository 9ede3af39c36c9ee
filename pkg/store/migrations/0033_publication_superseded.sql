-- A publication whose work a newer revision of the same pull request
-- replaced before it was made ends 'superseded', with the revision in its
-- reason, instead of posting a review of an older commit.
ALTER TABLE publications DROP CONSTRAINT publications_state_check;
ALTER TABLE publications ADD CONSTRAINT publications_state_check
    CHECK (state IN ('pending', 'published', 'failed', 'skipped', 'superseded'));
