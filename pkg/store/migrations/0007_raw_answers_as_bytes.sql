-- A model's raw answer is kept exactly as it came, whatever its bytes:
-- text that is not UTF-8, or holds a NUL, cannot live in a text column.
ALTER TABLE attempts ALTER COLUMN raw_response TYPE bytea USING convert_to(raw_response, 'UTF8');
