package console

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/idem-go/idem"
)

// dlqIndexData is the list of dead-letter queues with their counts.
type dlqIndexData struct {
	Queues []dlqSummary
}

type dlqSummary struct {
	Index int
	Name  string
	Total int
	Err   string
}

// queueParam returns the queue ?q= names: an index into the configured
// queues, so a request can only reach those.
func (s *Server) queueParam(w http.ResponseWriter, r *http.Request, v string) (int, DeadLetterQueue, bool) {
	if len(s.cfg.DeadLetters) == 0 {
		s.fail(w, r, http.StatusNotFound, "no dead-letter queue configured (idem console --amqp URL --queue NAME)")
		return 0, nil, false
	}
	i, err := strconv.Atoi(v)
	if err != nil || i < 0 || i >= len(s.cfg.DeadLetters) {
		s.fail(w, r, http.StatusBadRequest, fmt.Sprintf("q must name a configured queue, 0..%d", len(s.cfg.DeadLetters)-1))
		return 0, nil, false
	}
	return i, s.cfg.DeadLetters[i], true
}

func (s *Server) dlqIndex(w http.ResponseWriter, r *http.Request) {
	if len(s.cfg.DeadLetters) == 1 {
		http.Redirect(w, r, "/dlq/list?q=0", http.StatusSeeOther)
		return
	}
	var d dlqIndexData
	for i, q := range s.cfg.DeadLetters {
		sum := dlqSummary{Index: i, Name: q.Name()}
		if _, total, err := q.List(r.Context(), 1); err != nil {
			sum.Err = err.Error()
		} else {
			sum.Total = total
		}
		d.Queues = append(d.Queues, sum)
	}
	s.render(w, r, http.StatusOK, "dlq", d)
}

// dlqListData is one page of a dead-letter queue.
type dlqListData struct {
	Index      int
	Name       string
	Msgs       []DeadLetter
	Total      int
	Offset     int
	Limit      int
	Next, Prev int
	HasNext    bool
	HasPrev    bool
	Notice     string
	Now        time.Time
	CanAct     bool
	Scanned    int
	ScanBound  int
}

// dlqList pages through a queue by offset: a queue has no cursor, so a page
// reads offset+limit messages, at most deadScan.
func (s *Server) dlqList(w http.ResponseWriter, r *http.Request) {
	i, q, ok := s.queueParam(w, r, r.URL.Query().Get("q"))
	if !ok {
		return
	}
	limit, err := pageSize(r)
	if err != nil {
		s.failErr(w, r, "dead letters", err)
		return
	}
	offset := 0
	if v := r.URL.Query().Get("offset"); v != "" {
		if offset, err = strconv.Atoi(v); err != nil || offset < 0 || offset >= deadScan {
			s.fail(w, r, http.StatusBadRequest, fmt.Sprintf("offset must be 0..%d (the console reads at most the first %d dead letters of a queue)", deadScan-1, deadScan))
			return
		}
	}
	read := min(offset+limit+1, deadScan)
	msgs, total, err := q.List(r.Context(), read)
	if err != nil {
		s.failErr(w, r, "dead letters of "+q.Name(), err)
		return
	}
	d := dlqListData{Index: i, Name: q.Name(), Total: total, Offset: offset, Limit: limit, Notice: notice(r), Now: s.cfg.Now(),
		CanAct: !s.cfg.ReadOnly, Scanned: len(msgs), ScanBound: deadScan}
	if offset < len(msgs) {
		d.Msgs = msgs[offset:min(len(msgs), offset+limit)]
	}
	d.HasNext = len(msgs) > offset+limit && offset+limit < deadScan
	d.Next = offset + limit
	d.HasPrev = offset > 0
	d.Prev = max(0, offset-limit)
	s.render(w, r, http.StatusOK, "dlqlist", d)
}

// dlqMessageData is the page of one dead letter.
type dlqMessageData struct {
	Index  int
	Name   string
	Msg    DeadLetter
	Body   shownBytes
	Now    time.Time
	CanAct bool
}

func (s *Server) dlqMessage(w http.ResponseWriter, r *http.Request) {
	i, q, ok := s.queueParam(w, r, r.URL.Query().Get("q"))
	if !ok {
		return
	}
	id, err := param(r, "id")
	if err != nil || id == "" {
		s.fail(w, r, http.StatusBadRequest, "id must be a message id")
		return
	}
	m, err := q.Get(r.Context(), id, deadScan)
	if errors.Is(err, idem.ErrNotFound) {
		s.fail(w, r, http.StatusNotFound, fmt.Sprintf("message %s not found in the first %d dead letters of %s", quote(id), deadScan, q.Name()))
		return
	}
	if err != nil {
		s.failErr(w, r, "dead letter", err)
		return
	}
	s.render(w, r, http.StatusOK, "dlqmessage", dlqMessageData{Index: i, Name: q.Name(), Msg: m, Body: shown(m.Body),
		Now: s.cfg.Now(), CanAct: !s.cfg.ReadOnly})
}

func (s *Server) dlqRedrive(w http.ResponseWriter, r *http.Request) {
	i, q, ok := s.queueParam(w, r, r.PostForm.Get("q"))
	if !ok {
		return
	}
	ids := r.PostForm["id"]
	switch {
	case len(ids) == 0:
		s.fail(w, r, http.StatusBadRequest, "choose at least one dead letter")
		return
	case len(ids) > MaxPageSize:
		s.fail(w, r, http.StatusBadRequest, fmt.Sprintf("at most %d dead letters at once", MaxPageSize))
		return
	}
	for _, id := range ids {
		if id == "" || len(id) > maxParamBytes {
			s.fail(w, r, http.StatusBadRequest, "invalid message id")
			return
		}
	}
	res, err := q.Redrive(r.Context(), ids)
	s.logAction(r, "dlq redrive", "queue", q.Name(), "ids", ids, "redriven", res.Redriven, "capped", res.Capped,
		"missing", res.Missing, "err", err)
	if err != nil {
		s.failErr(w, r, "redrive from "+q.Name(), err)
		return
	}
	if len(res.Capped)+len(res.Missing) > 0 {
		s.fail(w, r, http.StatusConflict, fmt.Sprintf("redrove %d; not redriven: %d kept at the redrive cap %v, %d not found %v",
			len(res.Redriven), len(res.Capped), res.Capped, len(res.Missing), res.Missing))
		return
	}
	http.Redirect(w, r, "/dlq/list?"+url.Values{"q": {strconv.Itoa(i)}, "done": {"dlq"}, "n": {strconv.Itoa(len(res.Redriven))}}.Encode(),
		http.StatusSeeOther)
}
