DROP TABLE idem_inbox_token_counter;
DROP TABLE idem_inbox_attempts;
DROP TABLE idem_inbox;
