package idempgx_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/idem-go/idem/store/idempgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Retention at scale: convert a schema to the partitioned layout once,
// open the stores with Config.Partitioned, and call Maintain every few
// minutes (or run `idem keys maintain`). It needs a server
// (IDEM_POSTGRES_URL), so it has no Output check; it prints
//
//	current idem_records_p2, rotated true, dropped [idem_records_p0 idem_records_p1]
func ExampleStore_Maintain() {
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
	// Once: the plain table becomes partition 0; new records go to 1.
	if err := m.Partition(ctx, &idempgx.PartitionOptions{Interval: time.Hour}); err != nil {
		log.Fatal(err)
	}
	store, err := idempgx.New(pool, &idempgx.Config{Schema: schema, Partitioned: true})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Ping(ctx); err != nil {
		log.Fatal(err)
	}
	// Periodically. Rotate forces what the interval would do an hour later.
	rep, err := store.Maintain(ctx, &idempgx.MaintainOptions{Rotate: true})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("current idem_records_p%d, rotated %v, dropped %v\n", rep.Current, rep.Rotated, rep.Dropped)
}
