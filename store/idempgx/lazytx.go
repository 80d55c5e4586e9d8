package idempgx

import (
	"context"
	"errors"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// lazyTx is the pgx.Tx that the store's own transactions (Process,
// ProcessBatch, RecordStep, the inbox's Complete) run in. It holds a
// connection from the pool and sends BEGIN only with the transaction's
// first statement, in the same round trip (pgx's Batch.BeginTx): Process
// then costs BEGIN+insert, the handler's statements, COMMIT; one round trip
// less than pool.Begin's transaction, and a transaction that never sends a
// statement costs none.
//
// From that first statement on it is pgx's own transaction: every method
// delegates to the *pgx.dbTx the batch began, so savepoints, CopyFrom,
// SendBatch, LargeObjects, Commit and Rollback behave as with pool.Begin.
// Before it:
//
//   - Exec, Query, QueryRow and SendBatch carry BEGIN with them. Exec
//     without arguments (pgx runs it with the simple protocol, which allows
//     several statements in one string), a query with a pgx option other
//     than a QueryRewriter (QueryExecMode, result formats), and a pool
//     whose tracer is a QueryTracer but not a BatchTracer (it would not see
//     a statement sent in a batch) send BEGIN first, on its own.
//   - Begin (a savepoint), CopyFrom and LargeObjects send BEGIN first, on
//     its own; LargeObjects, which takes no context, with the context the
//     transaction was opened with.
//   - Prepare runs outside the transaction: a prepared statement belongs to
//     the session whatever the transaction does.
//   - Commit and Rollback send nothing and return the connection.
//   - Statements sent on Conn() directly are not in the transaction.
//
// A first statement that the server refuses before BEGIN ran (an error in
// preparing it: a syntax error, an unknown table), or a Prepare refused
// before the first statement, leaves the transaction as PostgreSQL would
// have: aborted. The statements after it fail with SQLSTATE 25P02,
// Rollback succeeds and Commit returns pgx.ErrTxCommitRollback. Errors that
// reached no server (argument encoding, a context already done) leave the
// transaction unbegun, as pgx's leave it usable, except one: an argument
// of the statement carrying BEGIN that fails to encode costs the
// connection, because pgx closes a batch it cannot finish, and the
// transaction then fails with that error as on a broken connection. In
// Process, ProcessBatch and RecordStep's record the first statement is the
// store's own; only the inbox's Complete and RecordStep hand the handler
// an unbegun transaction.
//
// A connection whose batch failed in transit (a context cancelled while
// BEGIN and the statement were in flight, a broken network) is closed by
// pgx or left outside the idle state; the pool destroys such a connection
// when it is released, so the next user never sees it.
type lazyTx struct {
	c    *pgxpool.Conn // nil once the transaction ended (released)
	conn *pgx.Conn
	ctx  context.Context // the opener's, for LargeObjects

	pipeline bool        // BEGIN may travel with the first statement
	tx       pgx.Tx      // the transaction once BEGIN was sent
	open     *beginBatch // the batch that carried BEGIN, until it is closed
	aborted  bool        // the server refused the first statement before BEGIN ran
	broken   error       // the connection failed before the transaction could begin
}

// pipelineBegin switches the pipelined BEGIN off for side-by-side
// benchmarks (see lazytx_export_test.go).
var pipelineBegin atomic.Bool

func init() { pipelineBegin.Store(true) }

// pipelines reports whether p's tracer sees batches: a QueryTracer that
// is not a BatchTracer would miss a statement sent with BEGIN, so such
// pools send BEGIN apart. New asks once per Store (pool.Config copies the
// configuration).
func pipelines(p *pgxpool.Pool) bool {
	if tr := p.Config().ConnConfig.Tracer; tr != nil { // a QueryTracer
		_, ok := tr.(pgx.BatchTracer)
		return ok
	}
	return true
}

// beginLazy acquires a connection for a transaction that has not begun;
// pipeline says whether BEGIN may travel with the first statement (see
// pipelines).
func beginLazy(ctx context.Context, p *pgxpool.Pool, pipeline bool) (*lazyTx, error) {
	c, err := p.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	return &lazyTx{c: c, conn: c.Conn(), ctx: ctx, pipeline: pipeline && pipelineBegin.Load()}, nil
}

// abortedError is what PostgreSQL answers a statement in an aborted
// transaction.
func abortedError() error {
	return &pgconn.PgError{
		Severity: "ERROR", SeverityUnlocalized: "ERROR", Code: "25P02",
		Message: "current transaction is aborted, commands ignored until end of transaction block",
		Detail:  "idempgx: the transaction's first statement failed before its BEGIN ran",
	}
}

// errBatchBeginTx is pgx's answer to a batch that begins a transaction
// sent within one.
var errBatchBeginTx = errors.New("Batch.BeginTx cannot be used within a transaction")

// ready closes the batch that carried BEGIN if its results are still open
// and returns the transaction, nil if BEGIN was not sent yet.
func (t *lazyTx) ready() (pgx.Tx, error) {
	if t.c == nil {
		return nil, pgx.ErrTxClosed
	}
	if t.open != nil {
		_ = t.open.Close()
	}
	switch {
	case t.broken != nil:
		return nil, t.broken
	case t.aborted:
		return nil, abortedError()
	}
	return t.tx, nil
}

// current returns the transaction, nil when BEGIN is still to be sent with
// the next statement (pipelined says it may be); otherwise it sends BEGIN
// on its own first.
func (t *lazyTx) current(ctx context.Context, pipelined bool) (pgx.Tx, error) {
	tx, err := t.ready()
	if err == nil && tx == nil && !pipelined {
		tx, err = t.begin(ctx)
	}
	return tx, err
}

// begin sends BEGIN on its own.
func (t *lazyTx) begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := t.conn.BeginTx(ctx, pgx.TxOptions{})
	if err != nil {
		return nil, err
	}
	t.tx = tx
	return tx, nil
}

// canPipeline says whether a statement with args can be sent in a batch
// after BEGIN: a batch takes no pgx option but a QueryRewriter, and an
// Exec without arguments may hold several statements.
func (t *lazyTx) canPipeline(exec bool, args []any) bool {
	if !t.pipeline || exec && len(args) == 0 {
		return false
	}
	if len(args) > 0 {
		switch args[0].(type) {
		case pgx.QueryExecMode, pgx.QueryResultFormats, pgx.QueryResultFormatsByOID:
			return false
		case pgx.QueryRewriter:
			return t.canPipeline(false, args[1:])
		}
	}
	return true
}

// send sends BEGIN and qs in one batch.
func (t *lazyTx) send(ctx context.Context, qs ...*pgx.QueuedQuery) *beginBatch {
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	b.QueuedQueries = append(b.QueuedQueries, qs...)
	br := t.conn.SendBatch(ctx, b)
	t.tx = br.Tx()
	t.open = &beginBatch{t: t, br: br}
	return t.open
}

// sent settles the transaction's state once the batch that carried BEGIN
// is closed with err.
func (t *lazyTx) sent(err error) {
	pc := t.conn.PgConn()
	if err == nil || pc.TxStatus() != 'I' && !pc.IsClosed() {
		return // the transaction is pgx's now
	}
	if pc.IsClosed() {
		// Whether BEGIN ran or not, the server ends the session's
		// transaction with the session: the transaction fails with err.
		t.tx, t.broken = nil, err
		return
	}
	// BEGIN did not run: the batch failed before it was executed.
	t.tx = nil
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		t.aborted = true
	}
}

// refused marks the transaction aborted after a statement the server
// refused outside it.
func (t *lazyTx) refused(err error) {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && !t.conn.IsClosed() {
		t.aborted = true
	}
}

func (t *lazyTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	tx, err := t.current(ctx, t.canPipeline(true, args))
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	if tx != nil {
		return tx.Exec(ctx, sql, args...)
	}
	b := t.send(ctx, &pgx.QueuedQuery{SQL: sql, Arguments: args})
	tag, err := b.Exec()
	if cerr := b.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

func (t *lazyTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	tx, err := t.current(ctx, t.canPipeline(false, args))
	if err != nil {
		return &errRows{conn: t.conn, err: err}, err
	}
	if tx != nil {
		return tx.Query(ctx, sql, args...)
	}
	b := t.send(ctx, &pgx.QueuedQuery{SQL: sql, Arguments: args})
	rows, err := b.Query()
	if err != nil {
		_ = b.Close()
		return &errRows{conn: t.conn, err: err}, err
	}
	return &batchRows{Rows: rows, b: b}, nil
}

func (t *lazyTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	rows, _ := t.Query(ctx, sql, args...)
	return &row{rows: rows}
}

func (t *lazyTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if pgx.FailedBatchResults(b, nil).Tx() != nil {
		return pgx.FailedBatchResults(b, errBatchBeginTx)
	}
	tx, err := t.current(ctx, t.pipeline || b.Len() == 0)
	switch {
	case err != nil:
		return pgx.FailedBatchResults(b, err)
	case tx != nil:
		return tx.SendBatch(ctx, b)
	case b.Len() == 0:
		return t.conn.SendBatch(ctx, b) // nothing to send
	}
	return t.send(ctx, b.QueuedQueries...)
}

func (t *lazyTx) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := t.current(ctx, false)
	if err != nil {
		return nil, err
	}
	return tx.Begin(ctx)
}

func (t *lazyTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	tx, err := t.current(ctx, false)
	if err != nil {
		return 0, err
	}
	return tx.CopyFrom(ctx, table, columns, src)
}

func (t *lazyTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	tx, err := t.ready()
	if err != nil {
		return nil, err
	}
	if tx != nil {
		return tx.Prepare(ctx, name, sql)
	}
	sd, err := t.conn.Prepare(ctx, name, sql)
	if err != nil {
		t.refused(err)
	}
	return sd, err
}

func (t *lazyTx) LargeObjects() pgx.LargeObjects {
	tx, err := t.ready()
	if err == nil && tx == nil {
		if tx, err = t.begin(t.ctx); err != nil {
			t.broken = err
		}
	}
	if tx == nil {
		tx = t.tx
	}
	if tx == nil {
		// A transaction that failed or ended unbegun: pgx's closed one,
		// whose large objects answer pgx.ErrTxClosed.
		b := &pgx.Batch{}
		b.BeginTx(pgx.TxOptions{})
		tx = pgx.FailedBatchResults(b, pgx.ErrTxClosed).Tx()
	}
	return tx.LargeObjects()
}

func (t *lazyTx) Conn() *pgx.Conn { return t.conn }

func (t *lazyTx) Commit(ctx context.Context) error {
	return t.end(ctx, true)
}

func (t *lazyTx) Rollback(ctx context.Context) error {
	return t.end(ctx, false)
}

// end commits or rolls back, and returns the connection to the pool.
func (t *lazyTx) end(ctx context.Context, commit bool) error {
	if t.c == nil {
		return pgx.ErrTxClosed
	}
	defer t.release()
	tx, err := t.ready()
	switch {
	case t.aborted && commit:
		return pgx.ErrTxCommitRollback
	case t.aborted, err != nil && !commit:
		return nil // nothing began
	case err != nil:
		return err
	case tx == nil:
		return nil
	case commit:
		return tx.Commit(ctx)
	default:
		return tx.Rollback(ctx)
	}
}

func (t *lazyTx) release() {
	if t.c != nil {
		t.c.Release()
		t.c = nil
	}
}

// beginBatch is the results of the batch that carried BEGIN: the batch's
// own, without BEGIN's.
type beginBatch struct {
	t         *lazyTx
	br        pgx.BatchResults
	beginRead bool
	beginErr  error
	closed    bool
	err       error
}

// begin reads BEGIN's result.
func (b *beginBatch) begin() error {
	if !b.beginRead {
		b.beginRead = true
		_, b.beginErr = b.br.Exec()
		b.beginErr = unwrapPreprocessing(b.beginErr)
	}
	return b.beginErr
}

func (b *beginBatch) Exec() (pgconn.CommandTag, error) {
	if err := b.begin(); err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := b.br.Exec()
	return tag, unwrapPreprocessing(err)
}

func (b *beginBatch) Query() (pgx.Rows, error) {
	if err := b.begin(); err != nil {
		return &errRows{conn: b.t.conn, err: err}, err
	}
	rows, err := b.br.Query()
	return rows, unwrapPreprocessing(err)
}

func (b *beginBatch) QueryRow() pgx.Row {
	if err := b.begin(); err != nil {
		return &row{rows: &errRows{conn: b.t.conn, err: err}}
	}
	return b.br.QueryRow()
}

func (b *beginBatch) Close() error {
	if b.closed {
		return b.err
	}
	b.closed = true
	_ = b.begin()
	b.err = unwrapPreprocessing(b.br.Close())
	if b.t.open == b {
		b.t.open = nil
	}
	b.t.sent(b.err)
	return b.err
}

func (b *beginBatch) Tx() pgx.Tx { return nil }

// unwrapPreprocessing returns the error a query sent alone would have
// returned: a batch wraps a failure to prepare or encode a query in
// pgx.ErrPreprocessingBatch.
func unwrapPreprocessing(err error) error {
	var pe pgx.ErrPreprocessingBatch
	if errors.As(err, &pe) {
		if inner := pe.Unwrap(); inner != nil {
			return inner
		}
	}
	return err
}

// batchRows are the rows of the statement that carried BEGIN; closing them
// closes its batch, so that the connection can take the next statement.
type batchRows struct {
	pgx.Rows
	b   *beginBatch
	err error
}

func (r *batchRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

func (r *batchRows) Close() {
	r.Rows.Close()
	if err := r.b.Close(); err != nil && r.Rows.Err() == nil {
		r.err = err
	}
}

func (r *batchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return unwrapPreprocessing(err)
	}
	return r.err
}

// errRows are the rows of a query that failed before it was sent.
type errRows struct {
	conn *pgx.Conn
	err  error
}

func (r *errRows) Close()                                       {}
func (r *errRows) Err() error                                   { return r.err }
func (r *errRows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (r *errRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (r *errRows) Next() bool                                   { return false }
func (r *errRows) Scan(...any) error                            { return r.err }
func (r *errRows) Values() ([]any, error)                       { return nil, r.err }
func (r *errRows) RawValues() [][]byte                          { return nil }
func (r *errRows) Conn() *pgx.Conn                              { return r.conn }
func (r *errRows) TypeMap() *pgtype.Map                         { return nil }

// row is QueryRow's row, as pgx's: the first row of rows, or
// pgx.ErrNoRows.
type row struct{ rows pgx.Rows }

func (r *row) Scan(dest ...any) error {
	rows := r.rows
	if err := rows.Err(); err != nil {
		rows.Close()
		return err
	}
	for _, d := range dest {
		if _, ok := d.(*pgtype.DriverBytes); ok {
			rows.Close()
			return errors.New("cannot scan into *pgtype.DriverBytes from QueryRow")
		}
	}
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	_ = rows.Scan(dest...)
	rows.Close()
	return rows.Err()
}
