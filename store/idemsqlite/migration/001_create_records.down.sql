DROP TABLE IF EXISTS idem_token_counter;
DROP INDEX IF EXISTS idem_records_expires_at_idx;
DROP TABLE IF EXISTS idem_records;
