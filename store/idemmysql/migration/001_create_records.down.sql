DROP TABLE IF EXISTS idem_tokens;
DROP TABLE IF EXISTS idem_records;
