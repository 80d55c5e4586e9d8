package idempgx

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/idemtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// These tests drive lazyTx directly: in Process the store's own statement
// is always the first, so the handler only meets a begun transaction.

// recorder is a pgx tracer that records the statements sent alone and the
// batches.
type recorder struct {
	mu      sync.Mutex
	queries []string
	batches [][]string
}

func (r *recorder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.queries = append(r.queries, d.SQL)
	return ctx
}

func (r *recorder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (r *recorder) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.queries, r.batches = nil, nil
}

func (r *recorder) sent() (queries []string, batches [][]string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.queries...), append([][]string(nil), r.batches...)
}

// batchRecorder also sees batches.
type batchRecorder struct{ recorder }

func (r *batchRecorder) TraceBatchStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchStartData) context.Context {
	var sqls []string
	for _, q := range d.Batch.QueuedQueries {
		sqls = append(sqls, q.SQL)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.batches = append(r.batches, sqls)
	return ctx
}

func (r *batchRecorder) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (r *batchRecorder) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

type lazyEnv struct {
	pool  *pgxpool.Pool
	s     *Store
	table string // (id int primary key, n int)
	app   string // the pool's application_name
}

// newLazyEnv opens a pool of maxConns connections of its own, with tracer
// (may be nil), and a table dropped at cleanup.
func newLazyEnv(t *testing.T, maxConns int32, tracer pgx.QueryTracer) *lazyEnv {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(idemtest.ServiceURL(t, "IDEM_POSTGRES_URL"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = maxConns
	cfg.ConnConfig.Tracer = tracer
	suffix := fmt.Sprintf("%d", time.Now().UnixNano()%1e12)
	app := "idem_lazytx_" + suffix
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	e := &lazyEnv{pool: p, s: &Store{pool: p, pipeline: pipelines(p)}, table: "lazytx_" + suffix, app: app}
	if _, err := p.Exec(context.Background(), "CREATE TABLE "+e.table+" (id int PRIMARY KEY, n int NOT NULL DEFAULT 0)"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if _, err := p.Exec(ctx, "DROP TABLE "+e.table); err != nil {
			t.Errorf("drop %s: %v", e.table, err)
		}
	})
	return e
}

func lazyCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func (e *lazyEnv) open(t *testing.T, ctx context.Context) *lazyTx {
	t.Helper()
	tx, err := beginLazy(ctx, e.pool, pipelines(e.pool))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) }) // after a failure
	return tx
}

// insert inserts id in tx, failing the test on an error.
func (e *lazyEnv) insert(t *testing.T, ctx context.Context, tx pgx.Tx, id int) {
	t.Helper()
	if _, err := tx.Exec(ctx, "INSERT INTO "+e.table+" (id) VALUES ($1)", id); err != nil {
		t.Fatal(err)
	}
}

// ids returns the table's ids, in order.
func (e *lazyEnv) ids(t *testing.T) []int {
	t.Helper()
	rows, _ := e.pool.Query(context.Background(), "SELECT id FROM "+e.table+" ORDER BY id")
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// clean checks that every connection is back in the pool, idle and
// outside a transaction, for its next user, and that the server holds no
// session of the pool's in a transaction.
func (e *lazyEnv) clean(t *testing.T) {
	t.Helper()
	// A connection the pool destroys counts as acquired until it is closed.
	for deadline := time.Now().Add(20 * time.Second); e.pool.Stat().AcquiredConns() != 0; {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections still acquired", e.pool.Stat().AcquiredConns())
		}
		time.Sleep(10 * time.Millisecond)
	}
	ctx := lazyCtx(t)
	conns := make([]*pgxpool.Conn, 0, e.pool.Config().MaxConns)
	release := func() {
		for _, c := range conns {
			c.Release()
		}
		conns = nil
	}
	defer release()
	for range e.pool.Stat().IdleConns() {
		c, err := e.pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		if st := c.Conn().PgConn().TxStatus(); st != 'I' {
			t.Fatalf("pooled connection in transaction status %q", st)
		}
		if _, err := c.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatalf("pooled connection: %v", err)
		}
	}
	release()
	// A session the client gave up on may take a moment to end on the server.
	for deadline := time.Now().Add(20 * time.Second); ; {
		var n int
		if err := e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE application_name = $1 AND state LIKE 'idle in transaction%'`, e.app).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d sessions of the pool idle in a transaction on the server", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// firstOps are the ways a transaction's first statement can insert id.
var firstOps = []struct {
	name      string
	pipelined bool
	run       func(ctx context.Context, tx pgx.Tx, table string, id int) error
}{
	{"Exec", true, func(ctx context.Context, tx pgx.Tx, table string, id int) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+table+" (id) VALUES ($1)", id)
		return err
	}},
	{"ExecNoArgs", false, func(ctx context.Context, tx pgx.Tx, table string, id int) error {
		// Two statements in one string, as the simple protocol allows.
		_, err := tx.Exec(ctx, fmt.Sprintf("INSERT INTO %s (id) VALUES (%d); UPDATE %[1]s SET n = 1 WHERE id = %[2]d", table, id))
		return err
	}},
	{"ExecWithMode", false, func(ctx context.Context, tx pgx.Tx, table string, id int) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+table+" (id) VALUES ($1)", pgx.QueryExecModeExec, id)
		return err
	}},
	{"ExecNamedArgs", true, func(ctx context.Context, tx pgx.Tx, table string, id int) error {
		_, err := tx.Exec(ctx, "INSERT INTO "+table+" (id) VALUES (@id)", pgx.NamedArgs{"id": id})
		return err
	}},
	{"Query", true, func(ctx context.Context, tx pgx.Tx, table string, id int) error {
		rows, _ := tx.Query(ctx, "INSERT INTO "+table+" (id) VALUES ($1) RETURNING id", id)
		got, err := pgx.CollectOneRow(rows, pgx.RowTo[int])
		if err == nil && got != id {
			err = fmt.Errorf("returned %d", got)
		}
		return err
	}},
	{"QueryNotClosed", true, func(ctx context.Context, tx pgx.Tx, table string, id int) error {
		// Rows left open: the next statement must still find the
		// connection ready.
		if _, err := tx.Query(ctx, "INSERT INTO "+table+" (id) VALUES ($1) RETURNING id", id); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "UPDATE "+table+" SET n = n + 1 WHERE id = $1", id)
		return err
	}},
	{"QueryRow", true, func(ctx context.Context, tx pgx.Tx, table string, id int) error {
		var got int
		err := tx.QueryRow(ctx, "INSERT INTO "+table+" (id) VALUES ($1) RETURNING id", id).Scan(&got)
		if err == nil && got != id {
			err = fmt.Errorf("returned %d", got)
		}
		return err
	}},
	{"SendBatch", true, func(ctx context.Context, tx pgx.Tx, table string, id int) error {
		b := &pgx.Batch{}
		var got int
		b.Queue("INSERT INTO "+table+" (id) VALUES ($1) RETURNING id", id).QueryRow(func(r pgx.Row) error { return r.Scan(&got) })
		b.Queue("UPDATE "+table+" SET n = n + 1 WHERE id = $1", id)
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return err
		}
		if got != id {
			return fmt.Errorf("returned %d", got)
		}
		return nil
	}},
	{"SendBatchRead", true, func(ctx context.Context, tx pgx.Tx, table string, id int) error {
		b := &pgx.Batch{}
		b.Queue("INSERT INTO "+table+" (id) VALUES ($1)", id)
		b.Queue("SELECT n FROM "+table+" WHERE id = $1", id)
		br := tx.SendBatch(ctx, b)
		defer br.Close()
		if tag, err := br.Exec(); err != nil || tag.RowsAffected() != 1 {
			return fmt.Errorf("insert: %v, %w", tag, err)
		}
		var n int
		if err := br.QueryRow().Scan(&n); err != nil {
			return err
		}
		return br.Close()
	}},
	{"CopyFrom", false, func(ctx context.Context, tx pgx.Tx, table string, id int) error {
		n, err := tx.CopyFrom(ctx, pgx.Identifier{table}, []string{"id"}, pgx.CopyFromRows([][]any{{id}}))
		if err == nil && n != 1 {
			err = fmt.Errorf("copied %d", n)
		}
		return err
	}},
	{"Prepare", true, func(ctx context.Context, tx pgx.Tx, table string, id int) error {
		sd, err := tx.Prepare(ctx, "lazy_insert_"+table, "INSERT INTO "+table+" (id) VALUES ($1)")
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, sd.Name, id)
		return err
	}},
	{"Savepoint", false, func(ctx context.Context, tx pgx.Tx, table string, id int) error {
		sp, err := tx.Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := sp.Exec(ctx, "INSERT INTO "+table+" (id) VALUES ($1)", id); err != nil {
			return err
		}
		return sp.Commit(ctx)
	}},
	{"LargeObjects", false, func(ctx context.Context, tx pgx.Tx, table string, id int) error {
		lo := tx.LargeObjects()
		oid, err := lo.Create(ctx, 0)
		if err != nil {
			return err
		}
		if err := lo.Unlink(ctx, oid); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, "INSERT INTO "+table+" (id) VALUES ($1)", id)
		return err
	}},
}

// Every way of starting the transaction runs in it: its rollback undoes
// it and its commit keeps it; BEGIN travels with the first statement where
// it can, and the tracer sees every statement.
func TestLazyTxFirstStatement(t *testing.T) {
	t.Parallel()
	rec := &batchRecorder{}
	e := newLazyEnv(t, 2, rec)
	ctx := lazyCtx(t)
	for i, op := range firstOps {
		for _, commit := range []bool{false, true} {
			id := 2*i + map[bool]int{false: 0, true: 1}[commit]
			rec.reset()
			tx := e.open(t, ctx)
			if err := op.run(ctx, tx, e.table, id); err != nil {
				t.Fatalf("%s: %v", op.name, err)
			}
			queries, batches := rec.sent()
			pipelined := len(batches) > 0 && len(batches[0]) > 1 && batches[0][0] == "begin"
			if pipelined != op.pipelined {
				t.Errorf("%s: BEGIN sent with the first statement = %v, want %v (queries %q, batches %q)", op.name, pipelined, op.pipelined, queries, batches)
			}
			if !pipelined && (len(queries) == 0 || queries[0] != "begin") {
				t.Errorf("%s: queries %q, want begin first", op.name, queries)
			}
			end := tx.Rollback
			if commit {
				end = tx.Commit
			}
			if err := end(ctx); err != nil {
				t.Fatalf("%s: end (commit %v): %v", op.name, commit, err)
			}
		}
	}
	want := make([]int, len(firstOps))
	for i := range firstOps {
		want[i] = 2*i + 1
	}
	if got := e.ids(t); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("ids = %v, want the committed ones %v", got, want)
	}
	e.clean(t)
}

// A transaction that sends nothing costs no round trip and gives its
// connection back; a second end says ErrTxClosed, as pgx's.
func TestLazyTxUntouched(t *testing.T) {
	t.Parallel()
	rec := &batchRecorder{}
	e := newLazyEnv(t, 1, rec)
	ctx := lazyCtx(t)
	for _, commit := range []bool{false, true} {
		rec.reset()
		tx := e.open(t, ctx)
		end := tx.Rollback
		if commit {
			end = tx.Commit
		}
		if err := end(ctx); err != nil {
			t.Fatal(err)
		}
		if q, b := rec.sent(); len(q)+len(b) != 0 {
			t.Fatalf("sent %q %q for an untouched transaction", q, b)
		}
		if err := end(ctx); !errors.Is(err, pgx.ErrTxClosed) {
			t.Fatalf("second end = %v, want ErrTxClosed", err)
		}
		if _, err := tx.Exec(ctx, "SELECT $1::int", 1); !errors.Is(err, pgx.ErrTxClosed) {
			t.Fatalf("Exec after end = %v, want ErrTxClosed", err)
		}
		if err := tx.QueryRow(ctx, "SELECT 1").Scan(new(int)); !errors.Is(err, pgx.ErrTxClosed) {
			t.Fatalf("QueryRow after end = %v, want ErrTxClosed", err)
		}
		if err := tx.SendBatch(ctx, &pgx.Batch{}).Close(); !errors.Is(err, pgx.ErrTxClosed) {
			t.Fatalf("SendBatch after end = %v, want ErrTxClosed", err)
		}
		lo := tx.LargeObjects()
		if _, err := lo.Create(ctx, 0); !errors.Is(err, pgx.ErrTxClosed) {
			t.Fatalf("LargeObjects after end = %v, want ErrTxClosed", err)
		}
	}
	e.clean(t)
}

// With a tracer that sees statements but not batches, BEGIN goes alone so
// that the tracer still sees the first statement.
func TestLazyTxQueryTracerOnly(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	e := newLazyEnv(t, 1, rec)
	ctx := lazyCtx(t)
	rec.reset()
	tx := e.open(t, ctx)
	e.insert(t, ctx, tx, 1)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	q, _ := rec.sent()
	if len(q) != 3 || q[0] != "begin" || !strings.HasPrefix(q[1], "INSERT") || q[2] != "commit" {
		t.Fatalf("traced %q, want begin, the insert, commit", q)
	}
	e.clean(t)
}

// A first statement that fails when it runs fails after BEGIN: the
// transaction is aborted on the server, as pgx's would be.
func TestLazyTxStatementErrorAborts(t *testing.T) {
	t.Parallel()
	e := newLazyEnv(t, 1, nil)
	ctx := lazyCtx(t)
	for _, first := range []struct {
		name string
		code string
		run  func(tx pgx.Tx) error
	}{
		{"runtime", "22012", func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "SELECT 1 / $1::int", 0)
			return err
		}},
		{"runtime-query", "22012", func(tx pgx.Tx) error {
			return tx.QueryRow(ctx, "SELECT 1 / $1::int", 0).Scan(new(int))
		}},
		// Refused while being prepared, before BEGIN ran: the transaction
		// is aborted all the same.
		{"prepare", "42P01", func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO no_such_table_lazytx VALUES ($1)", 1)
			return err
		}},
		{"prepare-query", "42601", func(tx pgx.Tx) error {
			return tx.QueryRow(ctx, "SELEC $1::int", 1).Scan(new(int))
		}},
		{"prepare-batch", "42P01", func(tx pgx.Tx) error {
			b := &pgx.Batch{}
			b.Queue("INSERT INTO "+e.table+" (id) VALUES ($1)", 1)
			b.Queue("INSERT INTO no_such_table_lazytx VALUES ($1)", 1)
			return tx.SendBatch(ctx, b).Close()
		}},
		{"Prepare", "42P01", func(tx pgx.Tx) error {
			_, err := tx.Prepare(ctx, "", "SELECT * FROM no_such_table_lazytx")
			return err
		}},
	} {
		for _, commit := range []bool{false, true} {
			tx := e.open(t, ctx)
			err := first.run(tx)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != first.code || strings.Contains(err.Error(), "preprocessing") {
				t.Fatalf("%s: first statement = %v, want the server's %s as pgx returns it", first.name, err, first.code)
			}
			_, err = tx.Exec(ctx, "INSERT INTO "+e.table+" (id) VALUES ($1)", 1)
			if !errors.As(err, &pgErr) || pgErr.Code != "25P02" {
				t.Fatalf("%s: next statement = %v, want 25P02 (transaction aborted)", first.name, err)
			}
			if _, err := tx.Begin(ctx); !errors.As(err, &pgErr) || pgErr.Code != "25P02" {
				t.Fatalf("%s: savepoint = %v, want 25P02", first.name, err)
			}
			if commit {
				if err := tx.Commit(ctx); !errors.Is(err, pgx.ErrTxCommitRollback) {
					t.Fatalf("%s: commit = %v, want ErrTxCommitRollback", first.name, err)
				}
			} else if err := tx.Rollback(ctx); err != nil {
				t.Fatalf("%s: rollback = %v", first.name, err)
			}
		}
	}
	if ids := e.ids(t); len(ids) != 0 {
		t.Fatalf("ids = %v after aborted transactions", ids)
	}
	e.clean(t)
}

// An argument that does not encode fails the statement without reaching
// the server. In pgx's transaction the transaction stays usable; here,
// when the statement carries BEGIN, pgx closes the batch's connection, so
// the transaction fails with that error and the connection is not reused.
func TestLazyTxEncodeError(t *testing.T) {
	t.Parallel()
	e := newLazyEnv(t, 1, nil)
	ctx := lazyCtx(t)
	for _, commit := range []bool{false, true} {
		tx := e.open(t, ctx)
		_, err := tx.Exec(ctx, "INSERT INTO "+e.table+" (id) VALUES ($1)", make(chan int))
		if err == nil || !strings.Contains(err.Error(), "chan") {
			t.Fatalf("a chan encoded as an int: %v", err)
		}
		if _, err2 := tx.Exec(ctx, "INSERT INTO "+e.table+" (id) VALUES ($1)", 7); err2 == nil || err2.Error() != err.Error() {
			t.Fatalf("next statement = %v, want the first's error %v", err2, err)
		}
		if commit {
			if err2 := tx.Commit(ctx); err2 == nil {
				t.Fatal("commit succeeded")
			}
		} else if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		e.clean(t)
	}
	// Once begun, it is pgx's transaction, which an encoding error leaves
	// usable.
	tx := e.open(t, ctx)
	e.insert(t, ctx, tx, 6)
	if _, err := tx.Exec(ctx, "INSERT INTO "+e.table+" (id) VALUES ($1)", make(chan int)); err == nil {
		t.Fatal("a chan encoded as an int")
	}
	e.insert(t, ctx, tx, 7)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if ids := e.ids(t); fmt.Sprint(ids) != "[6 7]" {
		t.Fatalf("ids = %v, want [6 7]", ids)
	}
	e.clean(t)
}

// A savepoint rolled back undoes only what followed it, whether the
// transaction began with it or before it.
func TestLazyTxSavepoint(t *testing.T) {
	t.Parallel()
	e := newLazyEnv(t, 1, nil)
	ctx := lazyCtx(t)
	for _, beganFirst := range []bool{false, true} {
		base := map[bool]int{false: 0, true: 10}[beganFirst]
		tx := e.open(t, ctx)
		if beganFirst {
			e.insert(t, ctx, tx, base)
		}
		sp, err := tx.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		e.insert(t, ctx, sp, base+1)
		sp2, err := sp.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		e.insert(t, ctx, sp2, base+2)
		if _, err := sp2.Exec(ctx, "SELECT 1 / $1::int", 0); err == nil {
			t.Fatal("no error")
		}
		if err := sp2.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if err := sp.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		e.insert(t, ctx, tx, base+3)
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := sp.Exec(ctx, "SELECT 1"); !errors.Is(err, pgx.ErrTxClosed) {
			t.Fatalf("savepoint after commit: %v, want ErrTxClosed", err)
		}
	}
	if ids := e.ids(t); fmt.Sprint(ids) != "[1 3 10 11 13]" {
		t.Fatalf("ids = %v, want [1 3 10 11 13]", ids)
	}
	e.clean(t)
}

// A batch that begins a transaction of its own is refused, as in pgx's
// transactions, and the transaction stays usable.
func TestLazyTxBatchBeginTxRefused(t *testing.T) {
	t.Parallel()
	e := newLazyEnv(t, 1, nil)
	ctx := lazyCtx(t)
	tx := e.open(t, ctx)
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	b.Queue("SELECT 1")
	if err := tx.SendBatch(ctx, b).Close(); err == nil || !strings.Contains(err.Error(), "BeginTx") {
		t.Fatalf("SendBatch of a BeginTx batch = %v", err)
	}
	e.insert(t, ctx, tx, 1)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	e.clean(t)
}

// A context done before the first statement sends nothing; one that ends
// while BEGIN and the statement are in flight leaves no connection in a
// transaction for the pool's next user.
func TestLazyTxContextCancelled(t *testing.T) {
	t.Parallel()
	e := newLazyEnv(t, 1, nil)
	ctx := lazyCtx(t)

	done, cancel := context.WithCancel(ctx)
	cancel()
	for _, op := range firstOps {
		tx := e.open(t, ctx)
		if err := op.run(done, tx, e.table, 1); !errors.Is(err, context.Canceled) {
			t.Fatalf("%s with a done context: %v", op.name, err)
		}
		if err := tx.Rollback(ctx); err != nil {
			t.Fatalf("%s: rollback: %v", op.name, err)
		}
		e.clean(t)
	}

	for _, op := range []string{"Exec", "QueryRow", "SendBatch"} {
		for _, commit := range []bool{false, true} {
			tx := e.open(t, ctx)
			short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			var err error
			switch op {
			case "Exec":
				_, err = tx.Exec(short, "SELECT pg_sleep($1)", 30)
			case "QueryRow":
				err = tx.QueryRow(short, "SELECT pg_sleep($1)", 30).Scan(nil)
			case "SendBatch":
				b := &pgx.Batch{}
				b.Queue("SELECT pg_sleep($1)", 30)
				err = tx.SendBatch(short, b).Close()
			}
			cancel()
			if err == nil {
				t.Fatalf("%s: a 30 s sleep returned within 200 ms", op)
			}
			// As inTxKey ends it: with a context that is not done.
			if commit {
				_ = tx.Commit(ctx) // an error, or ErrTxCommitRollback
			} else {
				_ = tx.Rollback(ctx)
			}
			e.clean(t)
		}
	}
	if ids := e.ids(t); len(ids) != 0 {
		t.Fatalf("ids = %v", ids)
	}
}

// inTxKey gives the lazy transaction back on a panic, with its batch still
// open or not, and on a handler error.
func TestLazyTxPanicAndError(t *testing.T) {
	t.Parallel()
	e := newLazyEnv(t, 2, nil)
	ctx := lazyCtx(t)
	boom := errors.New("boom")
	for _, c := range []struct {
		name string
		fn   func(tx pgx.Tx) (bool, error)
	}{
		{"panic-untouched", func(pgx.Tx) (bool, error) { panic(boom) }},
		{"panic-rows-open", func(tx pgx.Tx) (bool, error) {
			_, _ = tx.Query(ctx, "INSERT INTO "+e.table+" (id) SELECT g FROM generate_series(1, $1::int) g RETURNING id", 1000)
			panic(boom)
		}},
		{"panic-after-statement", func(tx pgx.Tx) (bool, error) {
			_, _ = tx.Exec(ctx, "INSERT INTO "+e.table+" (id) VALUES ($1)", 1)
			panic(boom)
		}},
		{"error", func(tx pgx.Tx) (bool, error) {
			_, _ = tx.Exec(ctx, "INSERT INTO "+e.table+" (id) VALUES ($1)", 1)
			return true, boom
		}},
		{"no-commit", func(tx pgx.Tx) (bool, error) {
			_, err := tx.Exec(ctx, "INSERT INTO "+e.table+" (id) VALUES ($1)", 1)
			return false, err
		}},
	} {
		func() {
			defer func() {
				if r := recover(); r != nil && r != boom {
					t.Fatalf("%s: panic %v", c.name, r)
				}
			}()
			err := e.s.inTx(ctx, "test", c.fn)
			if c.name == "error" && !errors.Is(err, boom) || c.name == "no-commit" && err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
		}()
		e.clean(t)
	}
	if ids := e.ids(t); len(ids) != 0 {
		t.Fatalf("ids = %v", ids)
	}
}

// Dozens of goroutines over a small pool, each transaction starting in one
// of the ways, some rolled back, some cancelled in flight: what committed
// is exactly what was meant to, and the pool ends clean.
func TestLazyTxConcurrent(t *testing.T) {
	t.Parallel()
	e := newLazyEnv(t, 6, &batchRecorder{})
	ctx := lazyCtx(t)
	const workers, each = 32, 12
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		want []int
	)
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				id := w*each + i
				op := firstOps[id%len(firstOps)]
				opCtx, cancel := ctx, context.CancelFunc(func() {})
				if id%7 == 3 {
					opCtx, cancel = context.WithCancel(ctx)
					cancel() // done before the first statement
				}
				err := e.s.inTx(ctx, "test", func(tx pgx.Tx) (bool, error) {
					if err := op.run(opCtx, tx, e.table, id); err != nil {
						return false, err
					}
					_, err := tx.Exec(ctx, "UPDATE "+e.table+" SET n = n + 1 WHERE id = $1", id)
					return id%5 != 0, err
				})
				cancel()
				switch {
				case id%7 == 3:
					if !errors.Is(err, context.Canceled) {
						t.Errorf("%s %d: %v, want canceled", op.name, id, err)
					}
				case err != nil:
					t.Errorf("%s %d: %v", op.name, id, err)
				case id%5 != 0:
					mu.Lock()
					want = append(want, id)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	got := e.ids(t)
	if len(got) != len(want) {
		t.Fatalf("%d rows, want %d", len(got), len(want))
	}
	seen := map[int]bool{}
	for _, id := range got {
		seen[id] = true
	}
	for _, id := range want {
		if !seen[id] {
			t.Fatalf("committed %d missing", id)
		}
	}
	e.clean(t)
}
