-- A relay marks the rows it was handed by message id and stream (a RESULT
-- and its ATTEMPT share a message id). With the id alone indexed, a plan
-- made before the table's statistics caught up combined that index with
-- the stream's, which matches every row of the stream: each mark cost a
-- scan of a whole stream's entries. One index on both answers the pair;
-- lookups by message id alone use its first column.
CREATE INDEX outbox_msg_id_stream ON outbox (msg_id, stream);
DROP INDEX outbox_msg_id;
