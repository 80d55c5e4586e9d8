package bench

import (
	"context"
	"strings"
	"testing"

	"github.com/idem-go/idem/idemtest"
	"github.com/jackc/pgx/v5"
)

func TestDescribeMount(t *testing.T) {
	const mounts = `/dev/vda / ext4 rw,relatime,discard,resv_strict 0 0
proc /proc proc rw,nosuid 0 0
/dev/loop0 /mnt/pgnodiscard ext4 rw,relatime 0 0
/dev/loop1 /mnt/pg\040space xfs rw,discard 0 0
/dev/loop2 /mnt/over ext4 rw,discard 0 0
/dev/loop3 /mnt/over ext4 rw 0 0
`
	for _, tc := range []struct{ dir, want string }{
		{"/var/lib/postgresql/15/main", "ext4 on / (/var/lib/postgresql/15/main), mounted with online discard"},
		{"/mnt/pgnodiscard/ts", "ext4 on /mnt/pgnodiscard (/mnt/pgnodiscard/ts), without online discard"},
		{"/mnt/pgnodiscardx/ts", "ext4 on / (/mnt/pgnodiscardx/ts), mounted with online discard"},
		{"/mnt/pg space/ts", "xfs on /mnt/pg space (/mnt/pg space/ts), mounted with online discard"},
		{"/mnt/over/ts", "ext4 on /mnt/over (/mnt/over/ts), without online discard"},
	} {
		if got := describeMount(tc.dir, mounts); got != tc.want {
			t.Errorf("describeMount(%q) = %q; want %q", tc.dir, got, tc.want)
		}
	}
	if got := describeMount("/x", "garbage\n"); got != "" {
		t.Errorf("no mount holds /x, got %q", got)
	}
}

func TestLoopback(t *testing.T) {
	for host, want := range map[string]bool{
		"127.0.0.1": true, "::1": true, "localhost": true, "/var/run/postgresql": true,
		"db.example.com": false, "10.0.0.5": false, "": false,
	} {
		if got := loopback(host); got != want {
			t.Errorf("loopback(%q) = %v; want %v", host, got, want)
		}
	}
}

// TestPostgresStorage reads where the test server keeps its tables (the
// default tablespace: the data directory) and how that filesystem is
// mounted; for a server on another host it says nothing.
func TestPostgresStorage(t *testing.T) {
	url := idemtest.ServiceURL(t, "IDEM_POSTGRES_URL")
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var dir string
	if err := conn.QueryRow(ctx, "SHOW data_directory").Scan(&dir); err != nil {
		t.Skipf("this role may not read data_directory: %v", err)
	}
	got := PostgresStorage(ctx, conn)
	if !loopback(conn.Config().Host) {
		if got != "" {
			t.Fatalf("a server elsewhere: %q, want nothing", got)
		}
		return
	}
	t.Log(got)
	if !strings.Contains(got, " on /") || !strings.Contains(got, dir) || !strings.Contains(got, "discard") {
		t.Fatalf("PostgresStorage = %q; want the filesystem of %s and whether it discards", got, dir)
	}
}
