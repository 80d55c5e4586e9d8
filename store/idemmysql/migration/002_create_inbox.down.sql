DROP TABLE IF EXISTS idem_inbox_tokens;
DROP TABLE IF EXISTS idem_inbox_attempts;
DROP TABLE IF EXISTS idem_inbox;
