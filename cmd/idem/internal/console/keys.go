package console

import (
	"context"
	"errors"
	"html/template"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
)

// keysData is the key-search page.
type keysData struct {
	Form      searchForm
	Searched  bool
	CanList   bool
	Records   []listedRecord
	Examined  int
	Next      string // cursor to go on from; empty at the end
	Short     bool   // the page is short because the search stopped at its bound
	Limit     int
	NextQuery template.URL
	Now       time.Time
}

// searchForm is the search's parameters, as typed.
type searchForm struct {
	Key, Scope, ScopeHash, KeyPrefix, ScopePrefix, State string
}

// listedRecord is one line of the results.
type listedRecord struct {
	idem.Record
	ScopeHash    string
	Link         string
	LeaseExpired bool
}

func (f searchForm) empty() bool { return f == searchForm{} }

func (f searchForm) filter() (idem.ListFilter, error) {
	lf := idem.ListFilter{Key: f.Key, Scope: f.Scope, KeyPrefix: f.KeyPrefix, ScopePrefix: f.ScopePrefix,
		ScopeHash: strings.ToLower(f.ScopeHash), State: idem.State(f.State)}
	if lf.Key != "" {
		if err := idem.ValidateKey(lf.Key); err != nil {
			return lf, err
		}
	}
	_, err := idem.ValidateList(idem.ListRequest{Filter: lf})
	return lf, err
}

// recordLink is the record page of (scope, key).
func recordLink(scope, key string) string {
	return "/keys/record?" + url.Values{"scope": {scope}, "key": {key}}.Encode()
}

// keys is the key search: by key (in every scope, or in one), scope, scope
// hash, key or scope prefix and state. A key with its scope opens the
// record; anything else lists, reading at most SearchExamine records per
// page.
func (s *Server) keys(w http.ResponseWriter, r *http.Request) {
	var f searchForm
	for name, dst := range map[string]*string{"key": &f.Key, "scope": &f.Scope, "scope_hash": &f.ScopeHash,
		"key_prefix": &f.KeyPrefix, "scope_prefix": &f.ScopePrefix, "state": &f.State} {
		v, err := param(r, name)
		if err != nil {
			s.failErr(w, r, "key search", err)
			return
		}
		*dst = strings.TrimSpace(v)
	}
	limit, err := pageSize(r)
	if err != nil {
		s.failErr(w, r, "key search", err)
		return
	}
	cursor, err := param(r, "cursor")
	if err != nil {
		s.failErr(w, r, "key search", err)
		return
	}
	d := keysData{Form: f, CanList: s.lister != nil, Limit: limit, Now: s.cfg.Now()}
	if f.empty() && cursor == "" && r.URL.Query().Get("all") == "" {
		s.render(w, r, http.StatusOK, "keys", d)
		return
	}
	filter, err := f.filter()
	if err != nil {
		s.failErr(w, r, "key search", err)
		return
	}
	exact := f.Key != "" && f.Scope != "" && f.ScopeHash == "" && f.KeyPrefix == "" && f.ScopePrefix == "" && f.State == ""
	if exact || s.lister == nil {
		if !exact {
			s.fail(w, r, http.StatusBadRequest, "this store cannot list its records: search by key and scope")
			return
		}
		if _, err := s.cfg.Store.Get(r.Context(), f.Scope, f.Key); err != nil {
			if errors.Is(err, idem.ErrNotFound) {
				s.fail(w, r, http.StatusNotFound, "no record for key "+quote(f.Key)+" in scope "+quote(f.Scope)+"; search without a scope to look in every scope")
				return
			}
			s.failErr(w, r, "key search", err)
			return
		}
		http.Redirect(w, r, recordLink(f.Scope, f.Key), http.StatusSeeOther)
		return
	}
	recs, next, examined, err := s.search(r.Context(), filter, limit, cursor)
	if err != nil {
		s.failErr(w, r, "key search", err)
		return
	}
	d.Searched, d.Next, d.Examined = true, next, examined
	d.Short = next != "" && len(recs) < limit
	for _, rec := range recs {
		d.Records = append(d.Records, listedRecord{Record: rec, ScopeHash: idem.ScopeHash(rec.Scope), Link: recordLink(rec.Scope, rec.Key),
			LeaseExpired: rec.State == idem.StateInProgress && !rec.LeaseExpiresAt.IsZero() && rec.LeaseExpiresAt.Before(d.Now)})
	}
	if next != "" {
		q := r.URL.Query()
		q.Set("cursor", next)
		d.NextQuery = template.URL(q.Encode())
	}
	s.render(w, r, http.StatusOK, "keys", d)
}

// search reads pages of the listing until it has limit records, the
// listing ends, SearchExamine records were examined (each List call
// examines at most storekit.ListExamine) or SearchTime has passed, and
// returns the cursor to go on from.
func (s *Server) search(ctx context.Context, f idem.ListFilter, limit int, cursor string) ([]idem.Record, string, int, error) {
	var recs []idem.Record
	examined := 0
	deadline := time.Now().Add(s.cfg.SearchTime)
	for {
		page, err := s.lister.List(ctx, idem.ListRequest{Filter: f, Limit: limit - len(recs), Cursor: cursor})
		if err != nil {
			return nil, "", examined, err
		}
		recs = append(recs, page.Records...)
		cursor = page.Next
		examined += listExamineStep
		if cursor == "" || len(recs) >= limit || examined >= s.cfg.SearchExamine || time.Now().After(deadline) {
			return recs, cursor, examined, nil
		}
	}
}

// listExamineStep is what one List call may examine at most
// (storekit.ListExamine), to count a search's work.
const listExamineStep = 5000

// recordData is the record page.
type recordData struct {
	Rec        idem.Record
	ScopeHash  string
	HTTP       bool
	Principal  string
	Method     string
	Route      string
	Response   *storedResponse
	Result     shownBytes
	DecodeErr  string
	Now        time.Time
	SearchLink string
}

// storedResponse is a stored HTTP response as the page shows it.
type storedResponse struct {
	Status     int
	StatusText string
	Headers    []Header
	Body       shownBytes
	Discarded  bool
	Upgraded   bool
}

// neverShown are the headers the console never renders, although the
// middleware never stores them: a response's credentials.
var neverShown = []string{"Authorization", "Proxy-Authorization", "Cookie", "Set-Cookie", "Set-Cookie2"}

func (s *Server) record(w http.ResponseWriter, r *http.Request) {
	scope, err := param(r, "scope")
	if err == nil {
		err = idem.Validate(scope, r.URL.Query().Get("key"))
	}
	if err != nil {
		s.failErr(w, r, "record", err)
		return
	}
	key := r.URL.Query().Get("key")
	rec, err := s.cfg.Store.Get(r.Context(), scope, key)
	if errors.Is(err, idem.ErrNotFound) {
		s.fail(w, r, http.StatusNotFound, "no record for key "+quote(key)+" in scope "+quote(scope))
		return
	}
	if err != nil {
		s.failErr(w, r, "record", err)
		return
	}
	d := recordData{Rec: rec, ScopeHash: idem.ScopeHash(rec.Scope), Now: s.cfg.Now(),
		SearchLink: "/keys?" + url.Values{"key": {rec.Key}}.Encode()}
	d.Principal, d.Method, d.Route, d.HTTP = idemhttp.ParseScope(rec.Scope)
	if len(rec.Result) > 0 {
		if resp, err := storedHTTP(rec); err == nil {
			d.Response = &storedResponse{Status: resp.Status, StatusText: http.StatusText(resp.Status), Body: shown(resp.Body),
				Discarded: resp.Discarded, Upgraded: resp.Upgraded}
			for _, k := range slices.Sorted(func(yield func(string) bool) {
				for k := range resp.Header {
					if !yield(k) {
						return
					}
				}
			}) {
				if slices.ContainsFunc(neverShown, func(n string) bool { return strings.EqualFold(n, k) }) {
					continue
				}
				for _, v := range resp.Header[k] {
					d.Response.Headers = append(d.Response.Headers, Header{k, cut(v, 1024)})
				}
			}
		} else {
			if strings.HasPrefix(rec.Scope, "http ") {
				d.DecodeErr = err.Error()
			}
			d.Result = shown(rec.Result)
		}
	}
	s.render(w, r, http.StatusOK, "record", d)
}

// storedHTTP decodes rec's result as a response the HTTP middleware or
// proxy stored; an error for any other record.
func storedHTTP(rec idem.Record) (*idemhttp.StoredResponse, error) {
	if !strings.HasPrefix(rec.Scope, "http ") || rec.Failed {
		return nil, errors.New("not an HTTP record")
	}
	return idemhttp.DecodeStoredResponse(rec.Result)
}

func quote(s string) string { return `"` + cut(s, 300) + `"` }
