-- A model's raw answer is kept exactly as it came, whatever its bytes:
-- text that is not UTF-8, or holds a NUL, cannot live in a text column.
ALTER TABLE attempts ALTER COLUMN raw_response TYPE bytea USING convert_to(raw_response, 'UTF8');

-- The ledger prices the model the classifier asked for, the one its budget
-- reservation was priced at; the name the provider answered with is kept
-- beside it. excess_micros is what an attempt cost beyond its reservation.
ALTER TABLE ledger
    ADD COLUMN served_model text,
    ADD COLUMN excess_micros bigint NOT NULL DEFAULT 0;
