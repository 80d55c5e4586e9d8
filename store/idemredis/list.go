package idemredis

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/idem-go/idem"
	"github.com/redis/rueidis"
)

var _ idem.Lister = (*Store)(nil)

const (
	// listScans bounds the SCAN calls of one List, and listCount is the
	// COUNT of each, so that a call examines about listScans*listCount
	// keys at most (SCAN's COUNT is a hint) whatever the filter.
	listScans = 10
	listCount = 500
	// listReadLen is the part of a record a listing reads (GETRANGE): the
	// header, scope and key, not the result.
	listReadLen = recordHeaderLen + idem.MaxScopeLen + idem.MaxKeyLen
	// listCursorPrefix marks this store's cursors.
	listCursorPrefix = "r1."
)

// listPos is where a Redis listing resumes: the node, its next SCAN
// cursor, and the records a SCAN call found that did not fit in the page
// (their digests), which come first. A SCAN call is never repeated: after a
// write or a resize of the keyspace it may return other keys.
type listPos struct {
	node    string
	cursor  uint64
	pending [][sha256.Size]byte
}

func (p listPos) String() string {
	raw := make([]byte, 0, len(p.pending)*sha256.Size)
	for _, d := range p.pending {
		raw = append(raw, d[:]...)
	}
	return listCursorPrefix + strconv.FormatUint(p.cursor, 10) + "." + base64.RawURLEncoding.EncodeToString(raw) + "." + p.node
}

func parseListPos(c string) (listPos, error) {
	bad := fmt.Errorf("%w: list cursor %q was not returned by idemredis", idem.ErrInvalidConfig, c)
	rest, ok := strings.CutPrefix(c, listCursorPrefix)
	parts := strings.SplitN(rest, ".", 3)
	if !ok || len(parts) != 3 {
		return listPos{}, bad
	}
	n, err := strconv.ParseUint(parts[0], 10, 64)
	raw, err2 := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil || err2 != nil || len(raw)%sha256.Size != 0 {
		return listPos{}, bad
	}
	p := listPos{cursor: n, node: parts[2]}
	for ; len(raw) > 0; raw = raw[sha256.Size:] {
		p.pending = append(p.pending, [sha256.Size]byte(raw[:sha256.Size]))
	}
	return p, nil
}

// List implements [idem.Lister] with SCAN over the keys of the store's
// prefix (never KEYS), one node after another on a cluster (its masters,
// by address), reading only the header, scope and key of each record
// (GETRANGE). One call issues at most 10 SCANs of COUNT 500, so a page of
// a filter that matches few records may be short or empty while it has a
// next cursor. Records come in SCAN order; as SCAN promises, a record that
// exists during the whole listing is listed, one written or deleted
// meanwhile may be listed or not, and one may be listed twice. Redis
// deletes expired records itself, so none is listed. A cursor carries the
// records one SCAN found beyond the page's Limit, 43 bytes each.
func (s *Store) List(ctx context.Context, req idem.ListRequest) (idem.ListPage, error) {
	req, err := idem.ValidateList(req)
	if err != nil {
		return idem.ListPage{}, err
	}
	var pos listPos
	if req.Cursor != "" {
		if pos, err = parseListPos(req.Cursor); err != nil {
			return idem.ListPage{}, err
		}
	}
	nodes, err := s.listNodes(ctx)
	if err != nil {
		return idem.ListPage{}, err
	}
	i := 0
	if req.Cursor != "" {
		i = slices.Index(nodes, pos.node)
		if i < 0 {
			return idem.ListPage{}, fmt.Errorf("idemredis: list: the cursor's node %s is no longer a master; start the listing again", pos.node)
		}
	} else {
		pos.node = nodes[0]
	}
	var page idem.ListPage
	// add keeps the records of keys that match, up to the page's limit, and
	// leaves the others in pos.pending.
	add := func(node rueidis.Client, keys []string) error {
		recs, err := s.readHeaders(ctx, node, keys)
		if err != nil {
			return err
		}
		pos.pending = nil
		for j, rec := range recs {
			if rec == nil || !req.Filter.Match(*rec) {
				continue
			}
			if len(page.Records) == req.Limit {
				pos.pending = append(pos.pending, s.digestOf(keys[j]))
				continue
			}
			page.Records = append(page.Records, *rec)
		}
		return nil
	}
	node, err := s.listNode(pos.node)
	if err != nil {
		return idem.ListPage{}, err
	}
	if len(pos.pending) > 0 {
		keys := make([]string, len(pos.pending))
		for j, d := range pos.pending {
			keys[j] = s.prefix + "{" + hex.EncodeToString(d[:]) + "}"
		}
		if err := add(node, keys); err != nil {
			return idem.ListPage{}, err
		}
		if len(pos.pending) > 0 {
			page.Next = pos.String()
			return page, nil
		}
		if pos.cursor == 0 { // that SCAN was the node's last
			if i++; i == len(nodes) {
				return page, nil
			}
			pos.node = nodes[i]
		}
	}
	pattern := globEscape(s.prefix) + "{*"
	for range listScans {
		if len(page.Records) == req.Limit {
			break
		}
		if node, err = s.listNode(pos.node); err != nil {
			return idem.ListPage{}, err
		}
		e, err := node.Do(ctx, node.B().Scan().Cursor(pos.cursor).Match(pattern).Count(listCount).Build()).AsScanEntry()
		if err != nil {
			return idem.ListPage{}, s.wrap("list", err)
		}
		if err := add(node, e.Elements); err != nil {
			return idem.ListPage{}, err
		}
		pos.cursor = e.Cursor
		if len(pos.pending) > 0 {
			break
		}
		if pos.cursor == 0 {
			if i++; i == len(nodes) {
				return page, nil
			}
			pos.node = nodes[i]
		}
	}
	page.Next = pos.String()
	return page, nil
}

// listNode is the client of the node a listing scans.
func (s *Store) listNode(addr string) (rueidis.Client, error) {
	if s.client.Mode() != rueidis.ClientModeCluster {
		return s.client, nil
	}
	if node := s.client.Nodes()[addr]; node != nil {
		return node, nil
	}
	return nil, fmt.Errorf("idemredis: list: node %s is gone; start the listing again", addr)
}

// digestOf is the digest in a record key of this store (see recordKey).
func (s *Store) digestOf(key string) (d [sha256.Size]byte) {
	h := strings.TrimSuffix(strings.TrimPrefix(key, s.prefix+"{"), "}")
	_, _ = hex.Decode(d[:], []byte(h))
	return d
}

// listNodes names the nodes to scan: "" for a single server, the masters
// by address on a cluster (a replica holds the same keys again).
func (s *Store) listNodes(ctx context.Context) ([]string, error) {
	if s.client.Mode() != rueidis.ClientModeCluster {
		return []string{""}, nil
	}
	var masters []string
	for addr, node := range s.client.Nodes() {
		role, err := node.Do(ctx, node.B().Role().Build()).ToArray()
		if err != nil {
			return nil, s.wrap("list: ROLE on "+addr, err)
		}
		if len(role) > 0 {
			if r, _ := role[0].ToString(); r == "master" {
				masters = append(masters, addr)
			}
		}
	}
	if len(masters) == 0 {
		return nil, errors.New("idemredis: list: the cluster client knows no master")
	}
	slices.Sort(masters)
	return masters, nil
}

// readHeaders reads the header, scope and key of each key, in one
// pipeline. A key that is gone, holds a removed record's stub or anything
// but a record of this store is nil.
func (s *Store) readHeaders(ctx context.Context, node rueidis.Client, keys []string) ([]*idem.Record, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	cmds := make(rueidis.Commands, len(keys))
	for i, k := range keys {
		cmds[i] = node.B().Getrange().Key(k).Start(0).End(listReadLen - 1).Build()
	}
	out := make([]*idem.Record, len(keys))
	for i, r := range node.DoMulti(ctx, cmds...) {
		raw, err := r.ToString()
		if rueidis.IsRedisNil(err) {
			continue
		}
		if err != nil {
			if _, ok := rueidis.IsRedisErr(err); ok {
				continue // WRONGTYPE: not a record of this store
			}
			return nil, s.wrap("list", err)
		}
		rec, err := parseRecord(raw)
		if err != nil || rec.Scope == "" && rec.Key == "" {
			continue
		}
		rec.Result = nil
		out[i] = &rec
	}
	return out, nil
}

// globEscape quotes the characters SCAN's MATCH takes for wildcards.
func globEscape(s string) string {
	var b strings.Builder
	for _, c := range []byte(s) {
		if strings.IndexByte(`*?[]\`, c) >= 0 {
			b.WriteByte('\\')
		}
		b.WriteByte(c)
	}
	return b.String()
}
