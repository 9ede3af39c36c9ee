-- The answer cap (max_tokens) of the work's next attempt when it differs
-- from the classifier's: raised once after an answer was cut at the cap.
ALTER TABLE work ADD COLUMN output_cap integer CHECK (output_cap > 0);
