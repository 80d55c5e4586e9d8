package idempgx_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idempgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A consumer credits an account once per message, however often the broker
// delivers it. It needs a server (IDEM_POSTGRES_URL), so it has no Output
// check; it prints
//
//	processed
//	duplicate
//	balance 100
func ExampleStore_Process() {
	url := os.Getenv("IDEM_POSTGRES_URL")
	if url == "" {
		log.Fatal("set IDEM_POSTGRES_URL")
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	schema := "idem_example_" + randomSuffix()
	defer pool.Exec(ctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	m, _ := idempgx.NewMigrator(pool, &idempgx.MigratorConfig{Schema: schema})
	if _, err := m.Up(ctx); err != nil {
		log.Fatal(err)
	}
	accounts := pgx.Identifier{schema, "accounts"}.Sanitize()
	if _, err := pool.Exec(ctx, "CREATE TABLE "+accounts+" (id int PRIMARY KEY, balance int NOT NULL); INSERT INTO "+accounts+" VALUES (1, 0)"); err != nil {
		log.Fatal(err)
	}

	store, err := idempgx.New(pool, &idempgx.Config{Schema: schema})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Ping(ctx); err != nil {
		log.Fatal(err)
	}

	body := []byte(`{"account":1,"amount":100}`)
	msg := idem.Message{Scope: "billing", Key: "msg-42", Fingerprint: idem.FingerprintBytes(body)}
	credit := func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "UPDATE "+accounts+" SET balance = balance + 100 WHERE id = 1")
		return err
	}
	for range 2 { // the broker delivers the message twice
		res, err := store.Process(ctx, msg, credit)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(res)
	}
	var balance int
	_ = pool.QueryRow(ctx, "SELECT balance FROM "+accounts+" WHERE id = 1").Scan(&balance)
	fmt.Println("balance", balance)
}
