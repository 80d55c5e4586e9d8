package idemmysql

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/go-sql-driver/mysql"
	"github.com/idem-go/idem"
)

// Oldest servers the store supports: the first with FOR UPDATE SKIP LOCKED,
// which the inbox's claims and Purge need.
const (
	MinMariaDB = "10.6"
	MinMySQL   = "8.0"
)

// CheckServerVersion checks the text of SELECT VERSION() (for example
// "10.11.6-MariaDB-0+deb12u1" or "8.0.36") against [MinMariaDB] and
// [MinMySQL]. An older or unreadable version is an error wrapping
// idem.ErrInvalidConfig that says which server is needed.
func CheckServerVersion(version string) error {
	maria := strings.Contains(strings.ToLower(version), "mariadb")
	name, min, minMajor, minMinor := "MySQL", MinMySQL, 8, 0
	if maria {
		name, min, minMajor, minMinor = "MariaDB", MinMariaDB, 10, 6
	}
	// MariaDB behind some proxies reports "5.5.5-10.11.6-MariaDB".
	v := strings.TrimPrefix(version, "5.5.5-")
	parts := strings.SplitN(v, ".", 3)
	var major, minor int
	var err error
	if len(parts) >= 2 {
		if major, err = strconv.Atoi(parts[0]); err == nil {
			minor, err = strconv.Atoi(strings.TrimRightFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' }))
		}
	}
	if len(parts) < 2 || err != nil {
		return fmt.Errorf("%w: idemmysql: cannot read the server version %q; idem needs MariaDB %s or MySQL %s or later",
			idem.ErrInvalidConfig, version, MinMariaDB, MinMySQL)
	}
	if major < minMajor || major == minMajor && minor < minMinor {
		return fmt.Errorf("%w: idemmysql: the server is %s %d.%d (%s); idem needs %s %s or later, the first with FOR UPDATE SKIP LOCKED",
			idem.ErrInvalidConfig, name, major, minor, version, name, min)
	}
	return nil
}

// checkServer reads the server's version and checks it.
func checkServer(ctx context.Context, q execer) error {
	var v string
	if err := q.QueryRowContext(ctx, "SELECT VERSION()").Scan(&v); err != nil {
		return wrapErr("server version", err)
	}
	return CheckServerVersion(v)
}

// currentDatabase names the connection's database.
func currentDatabase(ctx context.Context, q execer) (string, error) {
	var db sql.NullString
	if err := q.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&db); err != nil {
		return "", wrapErr("current database", err)
	}
	if !db.Valid {
		return "", fmt.Errorf("%w: idemmysql: the DSN names no database", idem.ErrInvalidConfig)
	}
	return db.String, nil
}

// ParseURL turns a URL of the form mysql://USER[:PASSWORD]@HOST[:PORT]/DB[?PARAMS]
// into a driver configuration: TCP, port 3306 by default, and every query
// parameter passed on as the driver's DSN parameter of the same name (for
// example tls=true or timeout=5s). It sets InterpolateParams (one round
// trip per statement instead of three for prepare, execute and close)
// unless the URL sets interpolateParams itself. Errors never quote the
// password.
func ParseURL(raw string) (*mysql.Config, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("%w: idemmysql: not a mysql:// URL", idem.ErrInvalidConfig)
	}
	if u.Scheme != "mysql" && u.Scheme != "mariadb" {
		return nil, fmt.Errorf("%w: idemmysql: URL scheme %q, want mysql://", idem.ErrInvalidConfig, u.Scheme)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("%w: idemmysql: the URL names no host; want mysql://USER[:PASSWORD]@HOST[:PORT]/DB", idem.ErrInvalidConfig)
	}
	db := strings.TrimPrefix(u.Path, "/")
	if db == "" || strings.Contains(db, "/") {
		return nil, fmt.Errorf("%w: idemmysql: the URL must name one database: mysql://USER[:PASSWORD]@HOST[:PORT]/DB", idem.ErrInvalidConfig)
	}
	cfg := mysql.NewConfig()
	cfg.Net = "tcp"
	cfg.Addr = u.Host
	if u.Port() == "" {
		cfg.Addr = u.Host + ":3306"
	}
	cfg.DBName = db
	if u.User != nil {
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	cfg.InterpolateParams = true
	q := u.Query()
	if len(q) > 0 {
		// The driver parses its own parameters: format the rest as a DSN
		// query and let it.
		dsn := "tcp(" + cfg.Addr + ")/" + db + "?" + q.Encode()
		parsed, err := parseDSN(dsn)
		if err != nil {
			return nil, fmt.Errorf("%w: idemmysql: URL parameters: %v", idem.ErrInvalidConfig, err)
		}
		parsed.User, parsed.Passwd = cfg.User, cfg.Passwd
		if !q.Has("interpolateParams") {
			parsed.InterpolateParams = true
		}
		cfg = parsed
	}
	return cfg, nil
}

// parseDSN is mysql.ParseDSN, which panics on some parameters it no
// longer supports (strict=…): a panic is returned as an error.
func parseDSN(dsn string) (cfg *mysql.Config, err error) {
	defer func() {
		if p := recover(); p != nil {
			cfg, err = nil, fmt.Errorf("%v", p)
		}
	}()
	return mysql.ParseDSN(dsn)
}
