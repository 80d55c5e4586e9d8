package idemredis

import (
	"context"
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

// listPos is where a Redis listing resumes: the SCAN cursor on one node
// and, within the keys that SCAN call returned (sorted), the last one
// already listed.
type listPos struct {
	node   string
	cursor uint64
	after  string
}

func (p listPos) String() string {
	return listCursorPrefix + strconv.FormatUint(p.cursor, 10) + "." + p.after + "." + p.node
}

func parseListPos(c string) (listPos, error) {
	rest, ok := strings.CutPrefix(c, listCursorPrefix)
	parts := strings.SplitN(rest, ".", 3)
	if !ok || len(parts) != 3 {
		return listPos{}, fmt.Errorf("%w: list cursor %q was not returned by idemredis", idem.ErrInvalidConfig, c)
	}
	n, err := strconv.ParseUint(parts[0], 10, 64)
	if err != nil {
		return listPos{}, fmt.Errorf("%w: list cursor %q was not returned by idemredis", idem.ErrInvalidConfig, c)
	}
	return listPos{cursor: n, after: parts[1], node: parts[2]}, nil
}

// List implements [idem.Lister] with SCAN over the keys of the store's
// prefix (never KEYS), one node after another on a cluster (its masters,
// by address), reading only the header, scope and key of each record
// (GETRANGE). One call issues at most 10 SCANs of COUNT 500, so a page of
// a filter that matches few records may be short or empty while it has a
// next cursor. Records come in SCAN order; as SCAN promises, a record that
// exists during the whole listing is listed, one written or deleted
// meanwhile may be listed or not, and one may be listed twice. Redis
// deletes expired records itself, so none is listed.
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
	pattern := globEscape(s.prefix) + "{*"
	var page idem.ListPage
	for range listScans {
		node := s.client
		if s.client.Mode() == rueidis.ClientModeCluster {
			node = s.client.Nodes()[pos.node]
			if node == nil {
				return idem.ListPage{}, fmt.Errorf("idemredis: list: node %s is gone; start the listing again", pos.node)
			}
		}
		e, err := node.Do(ctx, node.B().Scan().Cursor(pos.cursor).Match(pattern).Count(listCount).Build()).AsScanEntry()
		if err != nil {
			return idem.ListPage{}, s.wrap("list", err)
		}
		keys := e.Elements
		slices.Sort(keys)
		if pos.after != "" {
			keys = keys[sortedAfter(keys, s.prefix+pos.after):]
		}
		recs, err := s.readHeaders(ctx, node, keys)
		if err != nil {
			return idem.ListPage{}, err
		}
		for j, rec := range recs {
			if rec == nil || !req.Filter.Match(*rec) {
				continue
			}
			page.Records = append(page.Records, *rec)
			if len(page.Records) == req.Limit && j < len(keys)-1 {
				pos.after = strings.TrimPrefix(keys[j], s.prefix)
				page.Next = pos.String()
				return page, nil
			}
		}
		pos.cursor, pos.after = e.Cursor, ""
		if pos.cursor == 0 {
			if i++; i == len(nodes) {
				return page, nil
			}
			pos.node = nodes[i]
		}
		if len(page.Records) == req.Limit {
			break
		}
	}
	page.Next = pos.String()
	return page, nil
}

// sortedAfter is the index of the first of sorted keys greater than k.
func sortedAfter(keys []string, k string) int {
	i, found := slices.BinarySearch(keys, k)
	if found {
		i++
	}
	return i
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
