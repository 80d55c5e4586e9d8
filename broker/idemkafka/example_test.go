package idemkafka_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/idem-go/idem/broker/idemkafka"
	"github.com/idem-go/idem/consume"
	"github.com/idem-go/idem/store/idemsqlite"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Consume a topic into SQLite: each partition fetch is one ProcessBatch
// (one dedupe statement, one transaction), and the same event produced
// twice has one effect.
func Example() {
	ctx := context.Background()
	cluster, err := kfake.NewCluster(kfake.SeedTopics(1, "orders"))
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()
	dir, _ := os.MkdirTemp("", "idemkafka-example")
	defer os.RemoveAll(dir)
	store, err := idemsqlite.Open(ctx, "sqlite://"+filepath.Join(dir, "idem.db"), &idemsqlite.Config{AutoMigrate: true, Logger: quiet})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	store.DB().Exec(`CREATE TABLE invoices (msg_id TEXT PRIMARY KEY, body BLOB)`)

	producer, _ := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	defer producer.Close()
	for range 2 { // the producer's application retried
		producer.ProduceSync(ctx, idemkafka.NewRecord("orders", []byte(`{"order":42}`), "order-42"))
	}

	c, err := idemkafka.NewConsumer(&idemkafka.Config{
		Config:         consume.Config{Name: "billing", Logger: quiet},
		Topics:         []string{"orders"},
		ClientOpts:     []kgo.Opt{kgo.SeedBrokers(cluster.ListenAddrs()...)},
		TopicRetention: 12 * time.Hour, // records are re-read at most this long
		// One transaction per fetch: the dedupe records of every record
		// and the effects of those seen for the first time.
		BatchProcess: consume.TransactionalBatch(store, func(ctx context.Context, tx *sql.Tx, fresh []consume.Delivery) error {
			for _, d := range fresh {
				if _, err := tx.ExecContext(ctx, `INSERT INTO invoices VALUES (?, ?)`, d.ID(), idemkafka.RecordOf(d).Value); err != nil {
					return err
				}
			}
			return nil
		}),
	})
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithTimeout(ctx, 2*time.Second)
	defer stop()
	c.Run(runCtx)

	var n int
	store.DB().QueryRow(`SELECT count(*) FROM invoices`).Scan(&n)
	fmt.Println("invoices:", n)
	// Output: invoices: 1
}
