package idemmysql_test

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/store/idemmysql"
)

func TestIsRetryableError(t *testing.T) {
	t.Parallel()
	server := func(n uint16) error { return fmt.Errorf("wrapped: %w", &mysql.MySQLError{Number: n, Message: "x"}) }
	cases := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"deadlock 1213", server(1213), true},
		{"lock wait timeout 1205", server(1205), true},
		{"read-only 1290", server(1290), true},
		{"read-only transaction 1792", server(1792), true},
		{"read-only mode 1836", server(1836), true},
		{"too many connections 1040", server(1040), true},
		{"server shutdown 1053", server(1053), true},
		{"connection killed 1927", server(1927), true},
		{"duplicate key 1062", server(1062), false},
		{"no such table 1146", server(1146), false},
		{"syntax 1064", server(1064), false},
		{"foreign key 1452", server(1452), false},
		{"data too long 1406", server(1406), false},
		{"invalid connection", mysql.ErrInvalidConn, true},
		{"bad conn", driver.ErrBadConn, true},
		{"EOF", io.ErrUnexpectedEOF, true},
		{"reset", &net.OpError{Op: "read", Err: syscall.ECONNRESET}, true},
		{"refused", syscall.ECONNREFUSED, true},
		{"canceled", context.Canceled, false},
		{"canceled over a lost connection", fmt.Errorf("%w: %w", context.Canceled, mysql.ErrInvalidConn), false},
		{"other", errors.New("boom"), false},
	}
	for _, c := range cases {
		if got := idemmysql.IsRetryableError(c.err); got != c.want {
			t.Errorf("%s: IsRetryableError = %v, want %v", c.name, got, c.want)
		}
	}
}

// A real deadlock and a real lock wait timeout, as the server reports them,
// come out of the store retryable.
func TestServerLockErrorsAreRetryable(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	db := newDB(t, 4)
	if _, err := db.Exec("CREATE TABLE t (id INT PRIMARY KEY, v INT) ENGINE = InnoDB"); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("INSERT INTO t VALUES (1, 0), (2, 0)"); err != nil {
		t.Fatal(err)
	}

	t.Run("deadlock", func(t *testing.T) {
		tx1, _ := db.BeginTx(ctx, nil)
		tx2, _ := db.BeginTx(ctx, nil)
		defer tx1.Rollback()
		defer tx2.Rollback()
		mustExec(t, tx1.ExecContext, "UPDATE t SET v = v + 1 WHERE id = 1")
		mustExec(t, tx2.ExecContext, "UPDATE t SET v = v + 1 WHERE id = 2")
		var wg sync.WaitGroup
		var err1 error
		wg.Go(func() { _, err1 = tx1.ExecContext(ctx, "UPDATE t SET v = v + 1 WHERE id = 2") })
		time.Sleep(200 * time.Millisecond) // let tx1 wait on the lock
		_, err2 := tx2.ExecContext(ctx, "UPDATE t SET v = v + 1 WHERE id = 1")
		if err2 == nil {
			_ = tx2.Rollback() // tx1 was the victim: let it end
		}
		wg.Wait()
		err := errors.Join(err1, err2)
		var me *mysql.MySQLError
		if !errors.As(err, &me) || me.Number != 1213 {
			t.Fatalf("no deadlock error: %v", err)
		}
		if !idemmysql.IsRetryableError(err) {
			t.Fatalf("deadlock %v is not retryable", err)
		}
	})

	t.Run("lock wait timeout", func(t *testing.T) {
		conn, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		mustExec(t, conn.ExecContext, "SET SESSION innodb_lock_wait_timeout = 1")
		holder, _ := db.BeginTx(ctx, nil)
		defer holder.Rollback()
		mustExec(t, holder.ExecContext, "UPDATE t SET v = v + 1 WHERE id = 1")
		_, err = conn.ExecContext(ctx, "UPDATE t SET v = v + 1 WHERE id = 1")
		var me *mysql.MySQLError
		if !errors.As(err, &me) || me.Number != 1205 {
			t.Fatalf("no lock wait timeout: %v", err)
		}
		if !idemmysql.IsRetryableError(err) {
			t.Fatalf("lock wait timeout %v is not retryable", err)
		}
	})
}

func mustExec[R any](t *testing.T, exec func(context.Context, string, ...any) (R, error), q string) {
	t.Helper()
	if _, err := exec(context.Background(), q); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// A statement on a database without the idem tables says what to run.
func TestUnmigratedDatabase(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	s, err := idemmysql.New(newDB(t, 2), nil)
	if err != nil {
		t.Fatal(err)
	}
	err = s.Ping(ctx)
	var nm *idemmysql.NotMigratedError
	if !errors.As(err, &nm) || !errors.Is(err, idemmysql.ErrNotMigrated) || nm.Version != 0 || nm.Want != idemmysql.LatestVersion() ||
		!strings.HasPrefix(nm.Database, "idemtest_") {
		t.Fatalf("Ping = %v; want a NotMigratedError naming the database", err)
	}
	_, err = s.Claim(ctx, idem.ClaimRequest{Key: "k", Lease: time.Second})
	if !errors.Is(err, idemmysql.ErrNotMigrated) || !strings.Contains(err.Error(), "idem migrate up") {
		t.Fatalf("Claim = %v; want ErrNotMigrated naming the command", err)
	}
	if _, err := s.Get(ctx, "", "k"); !errors.Is(err, idemmysql.ErrNotMigrated) {
		t.Fatalf("Get = %v; want ErrNotMigrated", err)
	}
}

func TestNewRefusesBadConfig(t *testing.T) {
	t.Parallel()
	if _, err := idemmysql.New(nil, nil); !errors.Is(err, idem.ErrInvalidConfig) {
		t.Errorf("New(nil) = %v", err)
	}
	db := newDBOrNil(t)
	for _, cfg := range []idemmysql.Config{{MaxResultBytes: -1}, {PurgeBatch: -1}} {
		if _, err := idemmysql.New(db, &cfg); !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("New(%+v) = %v; want ErrInvalidConfig", cfg, err)
		}
	}
	s, err := idemmysql.New(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c := s.Config(); c.MaxResultBytes != idem.DefaultMaxResultBytes || c.PurgeBatch != 1000 || c.Logger == nil {
		t.Errorf("defaults = %+v", c)
	}
}

func TestCheckServerVersion(t *testing.T) {
	t.Parallel()
	for v, ok := range map[string]bool{
		"10.11.19-MariaDB-0+deb12u1": true,
		"10.6.0-MariaDB":             true,
		"11.4.2-MariaDB":             true,
		"5.5.5-10.11.6-MariaDB":      true,
		"10.5.23-MariaDB":            false,
		"10.3.39-MariaDB-0+deb10u1":  false,
		"8.0.36":                     true,
		"8.4.0":                      true,
		"9.1.0":                      true,
		"5.7.44-log":                 false,
		"garbage":                    false,
		"":                           false,
	} {
		err := idemmysql.CheckServerVersion(v)
		if (err == nil) != ok {
			t.Errorf("CheckServerVersion(%q) = %v, want ok %v", v, err, ok)
		}
		if err != nil && (!errors.Is(err, idem.ErrInvalidConfig) || !strings.Contains(err.Error(), "or later")) {
			t.Errorf("CheckServerVersion(%q) = %v; want ErrInvalidConfig saying which server is needed", v, err)
		}
	}
	err := idemmysql.CheckServerVersion("10.5.23-MariaDB")
	if !strings.Contains(err.Error(), "MariaDB 10.6") {
		t.Errorf("old MariaDB: %v; want it to name MariaDB 10.6", err)
	}
	err = idemmysql.CheckServerVersion("5.7.44")
	if !strings.Contains(err.Error(), "MySQL 8.0") {
		t.Errorf("old MySQL: %v; want it to name MySQL 8.0", err)
	}
}

func TestParseURL(t *testing.T) {
	t.Parallel()
	cfg, err := idemmysql.ParseURL("mysql://app:s3cr%40t@db.example:3307/orders")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.User != "app" || cfg.Passwd != "s3cr@t" || cfg.Addr != "db.example:3307" || cfg.DBName != "orders" || cfg.Net != "tcp" || !cfg.InterpolateParams {
		t.Errorf("ParseURL = %+v", cfg)
	}
	cfg, err = idemmysql.ParseURL("mysql://root@localhost/test?timeout=5s&interpolateParams=false&tls=skip-verify")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Addr != "localhost:3306" || cfg.Timeout != 5*time.Second || cfg.InterpolateParams || cfg.TLSConfig != "skip-verify" || cfg.User != "root" {
		t.Errorf("ParseURL with parameters = %+v", cfg)
	}
	for _, bad := range []string{
		"postgres://u:hunter2@h/db",
		"mysql://u:hunter2@h",
		"mysql://u:hunter2@h/a/b",
		"mysql://u:hunter2@/db",
		"mysql://u:hunter2@h/db?timeout=forever",
		"mysql://u:hunter2@h:bad port/db",
		"mysql://u:hunter2@h/db?strict=true", // the driver panics on it
	} {
		_, err := idemmysql.ParseURL(bad)
		if !errors.Is(err, idem.ErrInvalidConfig) {
			t.Errorf("ParseURL(%q) = %v; want ErrInvalidConfig", bad, err)
		}
		if err != nil && strings.Contains(err.Error(), "hunter2") {
			t.Errorf("ParseURL(%q) error quotes the password: %v", bad, err)
		}
	}
}
