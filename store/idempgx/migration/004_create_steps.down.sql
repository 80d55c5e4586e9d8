DROP TABLE idem_steps;
