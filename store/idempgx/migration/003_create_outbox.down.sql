DROP TABLE idem_outbox;
DROP SEQUENCE idem_outbox_token_seq;
