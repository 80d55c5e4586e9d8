DROP TABLE idem_outbox_token_counter;
DROP TABLE idem_outbox;
