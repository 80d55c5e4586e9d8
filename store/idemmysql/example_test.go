package idemmysql_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"

	"github.com/go-sql-driver/mysql"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idemmysql"
)

// A consumer credits an account once per message, however often the broker
// delivers it. It needs a server (IDEM_MYSQL_URL, e.g.
// mysql://root@127.0.0.1:3306/test), so it has no Output check; it prints
//
//	processed
//	duplicate
//	balance 100
func ExampleStore_Process() {
	cfg, err := idemmysql.ParseURL(os.Getenv("IDEM_MYSQL_URL"))
	if err != nil {
		log.Fatal(err)
	}
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		log.Fatal(err)
	}
	db := sql.OpenDB(connector)
	defer db.Close()
	ctx := context.Background()

	m, _ := idemmysql.NewMigrator(db)
	if _, err := m.Up(ctx); err != nil {
		log.Fatal(err)
	}
	if _, err := db.Exec("CREATE TABLE accounts (id INT PRIMARY KEY, balance INT NOT NULL)"); err != nil {
		log.Fatal(err)
	}
	defer db.Exec("DROP TABLE accounts")
	if _, err := db.Exec("INSERT INTO accounts VALUES (1, 0)"); err != nil {
		log.Fatal(err)
	}

	store, err := idemmysql.New(db, nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Ping(ctx); err != nil {
		log.Fatal(err)
	}

	body := []byte(`{"account":1,"amount":100}`)
	msg := idem.Message{Scope: "billing", Key: "msg-42", Fingerprint: idem.FingerprintBytes(body)}
	credit := func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "UPDATE accounts SET balance = balance + 100 WHERE id = 1")
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
	_ = db.QueryRow("SELECT balance FROM accounts WHERE id = 1").Scan(&balance)
	fmt.Println("balance", balance)
}
