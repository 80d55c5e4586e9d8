package bench

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
)

// PostgresStorage says where a PostgreSQL server on this machine keeps the
// tables the benchmarks create (the tablespace default_tablespace names, or
// the data directory) and how that filesystem is mounted, for instance
// "ext4 on / (/var/lib/postgresql/15/main), mounted with online discard".
// Online discard matters to the retention rows: dropping a large partition
// there stalls the server's commits while the device trims (see
// docs/operations.md). It returns "" when it cannot tell: a server on
// another host, or a role that may not read data_directory.
func PostgresStorage(ctx context.Context, conn *pgx.Conn) string {
	if !loopback(conn.Config().Host) {
		return ""
	}
	var dir string
	err := conn.QueryRow(ctx, `SELECT coalesce(nullif(pg_tablespace_location(t.oid), ''), current_setting('data_directory'))
FROM pg_tablespace AS t WHERE t.spcname = coalesce(nullif(current_setting('default_tablespace'), ''), 'pg_default')`).Scan(&dir)
	if err != nil {
		return ""
	}
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		dir = real
	}
	mounts, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return ""
	}
	return describeMount(dir, string(mounts))
}

// loopback reports whether host (a pgx Config.Host: a name, an address or
// a Unix socket directory) is this machine.
func loopback(host string) bool {
	if strings.HasPrefix(host, "/") || host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// describeMount finds the mount that holds dir in mounts (the text of
// /proc/self/mounts) and describes it; "" when none does.
func describeMount(dir, mounts string) string {
	var point, fstype string
	var opts []string
	for line := range strings.SplitSeq(mounts, "\n") {
		f := strings.Fields(line)
		if len(f) < 4 {
			continue
		}
		mp := unescapeMount(f[1])
		if !within(dir, mp) || len(mp) < len(point) {
			continue
		}
		// The last mount of a point is the one in use (mounted over).
		point, fstype, opts = mp, f[2], strings.Split(f[3], ",")
	}
	if point == "" {
		return ""
	}
	discard := "without online discard"
	if slices.Contains(opts, "discard") {
		discard = "mounted with online discard"
	}
	return fmt.Sprintf("%s on %s (%s), %s", fstype, point, dir, discard)
}

// within reports whether dir is mount point mp or under it.
func within(dir, mp string) bool {
	return mp == "/" || dir == mp || strings.HasPrefix(dir, strings.TrimSuffix(mp, "/")+"/")
}

// unescapeMount undoes the octal escapes of /proc/self/mounts (\040 for a
// space, and so on).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var c byte
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &c); err == nil {
				b.WriteByte(c)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
