DROP TABLE IF EXISTS idem_outbox_tokens;
DROP TABLE IF EXISTS idem_outbox;
