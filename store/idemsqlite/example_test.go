package idemsqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idemsqlite"
)

// Open a store, migrate it, and apply a message's effect exactly once: the
// redelivery is recognised as a duplicate and its handler does not run.
func Example() {
	dir, err := os.MkdirTemp("", "idemsqlite-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()
	dsn := "sqlite://" + filepath.Join(dir, "idem.db")

	// The CLI equivalent is `idem migrate up --store sqlite://PATH`.
	db, err := idemsqlite.OpenDB(ctx, dsn)
	if err != nil {
		log.Fatal(err)
	}
	m, _ := idemsqlite.NewMigrator(db)
	res, err := m.Up(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("applied migrations:", res.Versions)
	db.Close()

	store, err := idemsqlite.Open(ctx, dsn, nil)
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	if _, err := store.DB().ExecContext(ctx, "CREATE TABLE balances (account TEXT PRIMARY KEY, amount INTEGER NOT NULL)"); err != nil {
		log.Fatal(err)
	}

	body := []byte(`{"account":"alice","amount":100}`)
	msg := idem.Message{Scope: "payments", Key: "msg-0001", Fingerprint: idem.FingerprintBytes(body)}
	credit := func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO balances (account, amount) VALUES ('alice', 100)
			ON CONFLICT (account) DO UPDATE SET amount = amount + 100`)
		return err
	}
	for range 3 { // the broker delivers the same message three times
		result, err := store.Process(ctx, msg, credit)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(result)
	}
	var amount int
	if err := store.DB().QueryRowContext(ctx, "SELECT amount FROM balances WHERE account = 'alice'").Scan(&amount); err != nil {
		log.Fatal(err)
	}
	fmt.Println("balance:", amount)
	// Output:
	// applied migrations: [1 2 3 4]
	// processed
	// duplicate
	// duplicate
	// balance: 100
}
