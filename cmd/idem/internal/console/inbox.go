package console

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox"
	"github.com/idem-go/idem/inbox/inboxdriver"
)

// inboxData is the inbox list page.
type inboxData struct {
	Stats   []inbox.StateCount
	States  []inbox.State
	State   inbox.State
	Rows    []inbox.Row
	After   int64
	Next    int64 // the ?after= of the next page; 0 at the end
	Limit   int
	Notice  string
	Now     time.Time
	CanAct  bool
	Backlog int64
}

// notices are the messages an action's redirect may ask a page to show:
// fixed texts, so a link cannot make the console say anything else.
var notices = map[string]string{
	"redriven":  "Redrove %s dead message(s): they are pending again, due now.",
	"discarded": "Discarded %s dead message(s).",
	"dlq":       "Redrove %s dead letter(s) to their original queue.",
}

func notice(r *http.Request) string {
	f, ok := notices[r.URL.Query().Get("done")]
	if !ok {
		return ""
	}
	n, err := strconv.Atoi(r.URL.Query().Get("n"))
	if err != nil || n < 0 {
		return ""
	}
	return fmt.Sprintf(f, strconv.Itoa(n))
}

func (s *Server) needInbox(w http.ResponseWriter, r *http.Request) bool {
	if s.cfg.Inbox == nil {
		s.fail(w, r, http.StatusNotFound, "this store has no inbox (the inbox needs sqlite://, postgres:// or mysql://)")
		return false
	}
	return true
}

func (s *Server) inboxList(w http.ResponseWriter, r *http.Request) {
	if !s.needInbox(w, r) {
		return
	}
	state := inbox.State(r.URL.Query().Get("state"))
	if state == "" {
		state = inbox.StateDead
	}
	if !slices.Contains(inboxdriver.States(), state) {
		s.fail(w, r, http.StatusBadRequest, fmt.Sprintf("state must be one of %v, got %q", inboxdriver.States(), cut(string(state), 40)))
		return
	}
	limit, err := pageSize(r)
	if err != nil {
		s.failErr(w, r, "inbox", err)
		return
	}
	var after int64
	if v := r.URL.Query().Get("after"); v != "" {
		if after, err = strconv.ParseInt(v, 10, 64); err != nil || after < 0 {
			s.fail(w, r, http.StatusBadRequest, "after must be a row id (a number), got "+quote(v))
			return
		}
	}
	d := inboxData{States: inboxdriver.States(), State: state, After: after, Limit: limit, Notice: notice(r), Now: s.cfg.Now(),
		CanAct: !s.cfg.ReadOnly && state == inbox.StateDead}
	if d.Stats, err = s.cfg.Inbox.Stats(r.Context()); err != nil {
		s.failErr(w, r, "inbox stats", err)
		return
	}
	// One more row than the page tells whether there is a next page.
	rows, err := s.cfg.Inbox.List(r.Context(), inbox.ListRequest{State: state, AfterID: after, Limit: limit + 1})
	if err != nil {
		s.failErr(w, r, "inbox list", err)
		return
	}
	if len(rows) > limit {
		rows = rows[:limit]
		d.Next = rows[limit-1].ID
	}
	d.Rows = rows
	s.render(w, r, http.StatusOK, "inbox", d)
}

// rowData is the page of one inbox row.
type rowData struct {
	Row     inbox.Row
	History []inbox.Attempt
	Payload shownBytes
	Notice  string
	Now     time.Time
	CanAct  bool
}

func (s *Server) inboxRow(w http.ResponseWriter, r *http.Request) {
	if !s.needInbox(w, r) {
		return
	}
	id, err := strconv.ParseInt(r.URL.Query().Get("id"), 10, 64)
	if err != nil || id <= 0 {
		s.fail(w, r, http.StatusBadRequest, "id must be an inbox row id (a positive number)")
		return
	}
	row, hist, err := s.cfg.Inbox.Get(r.Context(), id)
	if errors.Is(err, idem.ErrNotFound) {
		s.fail(w, r, http.StatusNotFound, fmt.Sprintf("inbox row %d not found", id))
		return
	}
	if err != nil {
		s.failErr(w, r, "inbox row", err)
		return
	}
	s.render(w, r, http.StatusOK, "row", rowData{Row: row, History: hist, Payload: shown(row.Payload), Notice: notice(r),
		Now: s.cfg.Now(), CanAct: !s.cfg.ReadOnly && row.State == inbox.StateDead})
}

// formIDs reads the form's "id" values: 1..MaxPageSize row ids.
func formIDs(r *http.Request) ([]int64, error) {
	vals := r.PostForm["id"]
	if len(vals) == 0 {
		return nil, badParam("choose at least one dead message")
	}
	if len(vals) > MaxPageSize {
		return nil, badParam("at most %d messages at once", MaxPageSize)
	}
	ids := make([]int64, 0, len(vals))
	for _, v := range vals {
		id, err := strconv.ParseInt(v, 10, 64)
		if err != nil || id <= 0 {
			return nil, badParam("invalid inbox row id %s", quote(v))
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// afterAction is where an inbox action sends the browser: the row's page
// for one row, else the dead list.
func afterAction(ids []int64, done string, n int64) string {
	if len(ids) == 1 {
		return fmt.Sprintf("/inbox/row?id=%d&done=%s&n=%d", ids[0], done, n)
	}
	return fmt.Sprintf("/inbox?state=dead&done=%s&n=%d", done, n)
}

func (s *Server) inboxRedrive(w http.ResponseWriter, r *http.Request) {
	if !s.needInbox(w, r) {
		return
	}
	ids, err := formIDs(r)
	if err != nil {
		s.failErr(w, r, "inbox redrive", err)
		return
	}
	n, err := s.cfg.Inbox.Redrive(r.Context(), inbox.Select{IDs: ids})
	s.logAction(r, "inbox redrive", "ids", ids, "redriven", n, "err", err)
	if err != nil {
		s.failErr(w, r, "inbox redrive", err)
		return
	}
	http.Redirect(w, r, afterAction(ids, "redriven", n), http.StatusSeeOther)
}

// confirmData is the confirmation page of a destructive action.
type confirmData struct {
	Action string
	What   string
	IDs    []int64
	Rows   []inbox.Row
	Cancel string
}

// inboxDiscard deletes dead rows, after a confirmation: without
// confirm=yes it renders the confirmation page, which posts back here with
// it.
func (s *Server) inboxDiscard(w http.ResponseWriter, r *http.Request) {
	if !s.needInbox(w, r) {
		return
	}
	ids, err := formIDs(r)
	if err != nil {
		s.failErr(w, r, "inbox discard", err)
		return
	}
	if r.PostForm.Get("confirm") != "yes" {
		d := confirmData{Action: "/inbox/discard", IDs: ids, Cancel: "/inbox?state=dead",
			What: fmt.Sprintf("Delete %d dead message(s) from the inbox of %s for good? This cannot be undone.", len(ids), s.cfg.StoreName)}
		if len(ids) == 1 {
			d.Cancel = fmt.Sprintf("/inbox/row?id=%d", ids[0])
		}
		for _, id := range ids {
			if row, _, err := s.cfg.Inbox.Get(r.Context(), id); err == nil {
				d.Rows = append(d.Rows, row)
			}
		}
		s.render(w, r, http.StatusOK, "confirm", d)
		return
	}
	n, err := s.cfg.Inbox.Discard(r.Context(), inbox.Select{IDs: ids})
	s.logAction(r, "inbox discard", "ids", ids, "discarded", n, "err", err)
	if err != nil {
		s.failErr(w, r, "inbox discard", err)
		return
	}
	if len(ids) == 1 && n == 1 {
		http.Redirect(w, r, fmt.Sprintf("/inbox?state=dead&done=discarded&n=%d", n), http.StatusSeeOther)
		return
	}
	http.Redirect(w, r, afterAction(ids, "discarded", n), http.StatusSeeOther)
}
