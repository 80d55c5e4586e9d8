package main

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/store/idemmysql"
)

// mysqlDatabase creates a fresh database on the server of IDEM_MYSQL_URL
// (a mysql:// URL), dropped when the test ends, and returns the URL of it:
// the CLI is pointed at its own database, so tests never touch another.
func mysqlDatabase(t *testing.T) string {
	t.Helper()
	raw := idemtest.ServiceURL(t, "IDEM_MYSQL_URL")
	cfg, err := idemmysql.ParseURL(raw)
	if err != nil {
		t.Fatalf("IDEM_MYSQL_URL must be a mysql:// URL here: %v", err)
	}
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	admin := sql.OpenDB(connector)
	name := fmt.Sprintf("idem_cli_test_%08x", rand.Uint32())
	if _, err := admin.Exec("CREATE DATABASE " + name); err != nil {
		_ = admin.Close()
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() {
		defer admin.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := admin.ExecContext(ctx, "DROP DATABASE "+name); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	u, _ := url.Parse(raw)
	u.Path = "/" + name
	return u.String()
}

func TestKeysMySQL(t *testing.T) {
	t.Parallel()
	dsn := mysqlDatabase(t)
	testKeysLifecycle(t, []string{"--store", dsn}, func(t *testing.T) idem.Store {
		return openTestStore(t, storeConfig{DSN: dsn})
	})
}

func TestVerifyMySQL(t *testing.T) {
	t.Parallel()
	dsn := mysqlDatabase(t)
	wantExit(t, runCLI(t, nil, "migrate", "up", "--store", dsn), exitOK)
	r := runCLI(t, nil, append([]string{"verify", "--store", dsn}, quickVerify...)...)
	wantVerified(t, r, openTestStore(t, storeConfig{DSN: dsn}))
}

// TestInboxCommandsMySQL is TestInboxCommands over MySQL, in its own
// database.
func TestInboxCommandsMySQL(t *testing.T) {
	t.Parallel()
	dsn := mysqlDatabase(t)
	env := map[string]string{"IDEM_STORE": dsn}
	wantExit(t, runCLI(t, env, "migrate", "up"), exitOK)
	s, ok := openTestStore(t, storeConfig{DSN: dsn}).(*idemmysql.Store)
	if !ok {
		t.Fatal("mysql:// did not open an idemmysql store")
	}
	seedInbox(t, s.Inbox())
	checkInboxCommands(t, env, s.Inbox())
}

func TestProxyMySQL(t *testing.T) {
	t.Parallel()
	dsn := mysqlDatabase(t)
	wantExit(t, runCLI(t, nil, "migrate", "up", "--store", dsn), exitOK)
	api := &orderAPI{delay: 100 * time.Millisecond}
	up := httptest.NewServer(api)
	defer up.Close()
	base, stop := inProcessProxy(t, "--upstream", up.URL, "--store", dsn, "--lease", "2s")
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 50}}
	defer client.CloseIdleConnections()
	burst(t, client, base, api, 50)
	if code, logs := stop(); code != exitOK {
		t.Fatalf("exit %d: %s", code, logs)
	}
}

// A password in the URL is never printed: not when the server refuses it,
// not when the server is unreachable, not for a malformed URL.
func TestMySQLPasswordNeverPrinted(t *testing.T) {
	t.Parallel()
	raw := idemtest.ServiceURL(t, "IDEM_MYSQL_URL")
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	const secret = "hunter2-s3cr3t"
	wrongUser := *u
	wrongUser.User = url.UserPassword("idem_no_such_user", secret)
	unreachable := wrongUser
	unreachable.Host = "127.0.0.1:1"
	for name, dsn := range map[string]string{
		"refused by the server": wrongUser.String(),
		"unreachable":           unreachable.String(),
		"malformed":             "mysql://root:" + secret + "@127.0.0.1:3306/a/b",
		"bad parameter":         "mysql://root:" + secret + "@127.0.0.1:3306/test?timeout=forever",
	} {
		for _, args := range [][]string{{"keys", "get", "k"}, {"migrate", "up"}, {"migrate", "status"}, {"inbox", "stats"}} {
			r := runCLI(t, nil, append(args, "--store", dsn)...)
			if r.Code == exitOK {
				t.Errorf("%s: %v succeeded", name, args)
			}
			if strings.Contains(r.Stdout+r.Stderr, secret) {
				t.Errorf("%s: %v printed the password:\n%s%s", name, args, r.Stdout, r.Stderr)
			}
		}
	}
	r := runCLI(t, nil, "keys", "get", "k", "--store", wrongUser.String())
	wantExit(t, r, exitFailure, "cannot connect to MySQL", "idem_no_such_user")
}
