DROP TABLE idem_records;
DROP SEQUENCE idem_token_seq;
