package main

import (
	"context"
	"fmt"
	"net/url"
	"sort"
	"strings"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/shared/migration"
)

// backend is one store implementation the CLI can open, selected by the
// scheme of the DSN.
type backend struct {
	// Name is how messages call the backend, e.g. "PostgreSQL".
	Name string
	// Schemes are the DSN schemes that select it, e.g. "postgres".
	Schemes []string
	// Example is a DSN shown when the user's DSN is wrong.
	Example string
	// Open opens the store. It checks that the schema is migrated and that
	// the server is reachable, so commands fail before they do anything.
	Open func(ctx context.Context, cfg storeConfig) (idem.Store, func() error, error)
	// Migrator opens the schema migrator; nil when the backend has no
	// schema (Redis).
	Migrator func(ctx context.Context, cfg storeConfig) (migration.Migrator, func() error, error)
	// Migrations lists the embedded migrations, for "migrate sql", which
	// needs no connection.
	Migrations func() []migration.Migration
	// Schema is set when the backend keeps its tables in the schema --schema
	// names (PostgreSQL), so that messages name it.
	Schema bool
	// Vacuum reclaims the space that purged records leave behind, for
	// "keys purge --vacuum", and says what it did; nil when the backend has
	// nothing to reclaim or no way to.
	Vacuum func(ctx context.Context, s idem.Store, cfg storeConfig) (string, error)
	// ExpiresItself is set when the backend deletes expired records on its
	// own (Redis TTLs), so that purge has nothing to do.
	ExpiresItself bool
}

// storeConfig is what the user chose with --store and friends.
type storeConfig struct {
	DSN string
	// Schema is the PostgreSQL schema holding the idem tables (--schema);
	// other backends ignore it.
	Schema string
	// Create allows the backend to create what is missing (a SQLite file).
	// Only "migrate up" sets it, so a mistyped path is reported instead of
	// silently becoming a new, empty database.
	Create bool
}

var backends = map[string]*backend{}

// registerBackend makes b available under each of its schemes. Backends
// register themselves in init, one file per backend.
func registerBackend(b backend) {
	for _, s := range b.Schemes {
		if _, dup := backends[s]; dup {
			panic("idem: store scheme registered twice: " + s)
		}
		backends[s] = &b
	}
}

// defaultStore is the DSN used when neither --store nor IDEM_STORE is set.
const defaultStore = "sqlite://idem.db"

// lookupBackend returns the backend for dsn's scheme, or an error that
// lists the schemes that exist.
func lookupBackend(dsn string) (*backend, error) {
	scheme, _, ok := strings.Cut(dsn, "://")
	if !ok || scheme == "" {
		return nil, fmt.Errorf("invalid --store %q: want SCHEME://…, one of %s", redactDSN(dsn), schemeExamples())
	}
	b := backends[strings.ToLower(scheme)]
	if b == nil {
		return nil, fmt.Errorf("invalid --store %q: unknown scheme %q, want one of %s", redactDSN(dsn), scheme, schemeExamples())
	}
	return b, nil
}

func schemeExamples() string {
	seen := map[*backend]bool{}
	var ex []string
	for _, b := range backends {
		if !seen[b] {
			seen[b] = true
			ex = append(ex, b.Example)
		}
	}
	sort.Strings(ex)
	return strings.Join(ex, ", ")
}

// openStore opens the store cfg.DSN names. close releases it.
func openStore(ctx context.Context, cfg storeConfig) (store idem.Store, close func() error, err error) {
	b, err := lookupBackend(cfg.DSN)
	if err != nil {
		return nil, nil, err
	}
	return b.Open(ctx, cfg)
}

// describeStore names the store cfg selects for messages: its DSN without
// a password and, for a backend with schemas, the schema.
func describeStore(b *backend, cfg storeConfig) string {
	s := redactDSN(cfg.DSN)
	if b != nil && b.Schema {
		schema := cfg.Schema
		if schema == "" {
			schema = "public"
		}
		s += " (schema " + schema + ")"
	}
	return s
}

// redactDSN hides a password in dsn so errors can show it: the password of
// a URL's user info, and the value of a password=… (pwd=, token=, …) query
// or keyword/value parameter. When the URL parser cannot say where the user
// info ends (a parse error, no "://", an '@' it did not take as the end of
// the user info, as when the password holds a '/', '#' or '?', or a
// USER:PASSWORD@ shape it did not take for user info), everything up to
// the last '@' is hidden, user name included. An '@' alone in a SQLite path
// (sqlite:///srv/app@2/idem.db) is no password.
func redactDSN(dsn string) string {
	u, unsure := parseDSNUserInfo(dsn)
	switch {
	case unsure:
		if at := strings.LastIndex(dsn, "@"); at >= 0 {
			prefix := ""
			if scheme, _, ok := strings.Cut(dsn[:at], "://"); ok {
				prefix = scheme + "://"
			}
			dsn = prefix + "xxxxx" + dsn[at:]
		}
	case u.User != nil:
		if _, has := u.User.Password(); has {
			dsn = u.Redacted()
		}
	}
	return maskSecretParams(dsn)
}

// parseDSNUserInfo parses dsn as a URL and reports whether the parser
// cannot be trusted to have found where its user info ends: see
// redactDSN. u is nil when dsn does not parse.
func parseDSNUserInfo(dsn string) (u *url.URL, unsure bool) {
	u, err := url.Parse(dsn)
	unsure = err != nil || u.Opaque != "" || !strings.Contains(dsn, "://")
	if at := strings.LastIndex(dsn, "@"); !unsure && at >= 0 {
		_, beforeAt, _ := strings.Cut(dsn[:at], "://")
		_, hasPassword := u.User.Password()
		unsure = u.Scheme != "sqlite" && (u.User == nil || strings.ContainsRune(u.Path+u.RawQuery+u.Fragment, '@')) ||
			!hasPassword && strings.Contains(beforeAt, ":")
	}
	return u, unsure
}

// ambiguousUserInfo reports whether dsn is a URL ("scheme://…@…") whose
// user info the URL parser would end early, at a '/', '#' or '?' of the
// password (or an '@' it did not take as the end): a driver then
// connects as the wrong user to the wrong host and database, and every
// field it parsed may hold part of the password. Such a DSN is refused
// before any driver sees it.
func ambiguousUserInfo(dsn string) bool {
	if !strings.Contains(dsn, "://") || !strings.Contains(dsn, "@") {
		return false
	}
	_, unsure := parseDSNUserInfo(dsn)
	return unsure
}

// notMigratedError says the schema lacks migrations and how to apply them.
func notMigratedError(b *backend, cfg storeConfig, detail string) error {
	return fmt.Errorf("the %s store %s is not migrated (%s); run: %s", b.Name, redactDSN(cfg.DSN), detail, migrateUpCommand(cfg))
}

// migrateUpCommand is the command line that migrates the store cfg names,
// quoted for a POSIX shell.
func migrateUpCommand(cfg storeConfig) string {
	cmd := "idem migrate up --store " + shellQuote(redactDSN(cfg.DSN))
	if cfg.Schema != "" && cfg.Schema != "public" {
		cmd += " --schema " + shellQuote(cfg.Schema)
	}
	return cmd
}

// shellQuote quotes s for a POSIX shell unless it is made only of
// characters that need no quoting.
func shellQuote(s string) string {
	safe := s != ""
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("@%+=:,./_-", c)) {
			safe = false
			break
		}
	}
	if safe {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
