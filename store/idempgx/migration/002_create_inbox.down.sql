DROP TABLE idem_inbox_attempts;
DROP TABLE idem_inbox;
DROP SEQUENCE idem_inbox_token_seq;
