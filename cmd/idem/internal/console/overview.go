package console

import (
	"cmp"
	"context"
	"fmt"
	"html/template"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/inbox"
)

// overviewData is the overview page.
type overviewData struct {
	Now time.Time
	// Records: what a bounded read of the listing found.
	CanList      bool
	Examined     int
	Complete     bool // the read covered the whole store
	InProgress   int
	Completed    int
	Failed       int
	Tombstones   int
	LeaseExpired int
	StateChart   template.HTML
	// The last hour, per minute, from created_at and completed_at.
	Created, Done int
	HourChart     template.HTML
	// Inbox.
	HasInbox    bool
	InboxStats  []inbox.StateCount
	Backlog     int64
	OldestAge   time.Duration
	InboxErr    string
	DeadReasons []reasonCount
	// Dead letters per queue.
	Queues      []queueOverview
	ReasonChart template.HTML
}

type reasonCount struct {
	Where  string
	Reason string
	Count  int
}

type queueOverview struct {
	Index int
	Name  string
	Total int
	Read  int
	Err   string
}

// overview reads what it shows from the stores' own data, each read
// bounded: the records' states and their created/completed times from at
// most OverviewExamine records of the listing (and OverviewTime), the inbox's counts, and at
// most deadScan dead rows and dead letters per queue for their reasons.
//
// The stores keep no trace of a replay or of a mismatch (a replay reads the
// record and writes nothing; a mismatch is refused before anything is
// written), so the page shows executions as records created and completed
// per minute, and points to the metrics (idemprom) for replays and
// mismatches.
func (s *Server) overview(w http.ResponseWriter, r *http.Request) {
	d := overviewData{Now: s.cfg.Now(), CanList: s.lister != nil, HasInbox: s.cfg.Inbox != nil}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	var perMinute [2][60]int
	if s.lister != nil {
		if err := s.scanRecords(ctx, &d, &perMinute); err != nil {
			s.failErr(w, r, "overview: list records", err)
			return
		}
		d.StateChart = hbars([]bar{{"in progress", d.InProgress, colorRunning}, {"completed", d.Completed, colorOK},
			{"failed", d.Failed, colorBad}, {"tombstone", d.Tombstones, colorMuted}, {"lease expired", d.LeaseExpired, colorWarn}})
		d.HourChart = minuteChart(perMinute)
	}
	reasons := map[[2]string]int{}
	if s.cfg.Inbox != nil {
		s.inboxOverview(ctx, &d, reasons)
	}
	for i, q := range s.cfg.DeadLetters {
		qo := queueOverview{Index: i, Name: q.Name()}
		msgs, total, err := q.List(ctx, deadScan)
		if err != nil {
			qo.Err = err.Error()
		}
		qo.Total, qo.Read = total, len(msgs)
		for _, m := range msgs {
			reasons[[2]string{q.Name(), cmp.Or(m.Reason, "(none)")}] += max(m.Copies, 1)
		}
		d.Queues = append(d.Queues, qo)
	}
	var bars []bar
	for k, n := range reasons {
		d.DeadReasons = append(d.DeadReasons, reasonCount{k[0], k[1], n})
	}
	slices.SortFunc(d.DeadReasons, func(a, b reasonCount) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), cmp.Compare(a.Where, b.Where), cmp.Compare(a.Reason, b.Reason))
	})
	for _, rc := range d.DeadReasons {
		bars = append(bars, bar{rc.Reason + " · " + rc.Where, rc.Count, colorBad})
	}
	if len(bars) > 0 {
		d.ReasonChart = hbars(bars[:min(len(bars), 12)])
	}
	s.render(w, r, http.StatusOK, "overview", d)
}

// scanRecords reads the listing, OverviewExamine records and OverviewTime at
// most, counting
// states and the records created and completed in each minute of the last
// hour.
func (s *Server) scanRecords(ctx context.Context, d *overviewData, perMinute *[2][60]int) error {
	cursor := ""
	hourAgo := d.Now.Add(-time.Hour)
	deadline := time.Now().Add(s.cfg.OverviewTime)
	for d.Examined < s.cfg.OverviewExamine && (d.Examined == 0 || time.Now().Before(deadline)) {
		page, err := s.lister.List(ctx, idem.ListRequest{Limit: idem.MaxListLimit, Cursor: cursor})
		if err != nil {
			if ctx.Err() != nil && d.Examined > 0 {
				return nil // show what was read in the time allowed
			}
			return err
		}
		for _, rec := range page.Records {
			switch rec.State {
			case idem.StateInProgress:
				d.InProgress++
				if !rec.LeaseExpiresAt.IsZero() && rec.LeaseExpiresAt.Before(d.Now) {
					d.LeaseExpired++
				}
			case idem.StateCompleted:
				d.Completed++
			}
			if rec.Failed {
				d.Failed++
			}
			if rec.Tombstone {
				d.Tombstones++
			}
			if m, ok := minuteOf(rec.CreatedAt, hourAgo, d.Now); ok {
				perMinute[0][m]++
				d.Created++
			}
			if m, ok := minuteOf(rec.CompletedAt, hourAgo, d.Now); ok {
				perMinute[1][m]++
				d.Done++
			}
		}
		// A page without a filter holds every record the store read.
		d.Examined += len(page.Records)
		cursor = page.Next
		if cursor == "" {
			d.Complete = true
			return nil
		}
	}
	return nil
}

func minuteOf(t, from, to time.Time) (int, bool) {
	if t.IsZero() || t.Before(from) || !t.Before(to) {
		return 0, false
	}
	return min(int(t.Sub(from)/time.Minute), 59), true
}

// inboxOverview adds the inbox's counts, backlog and dead reasons.
func (s *Server) inboxOverview(ctx context.Context, d *overviewData, reasons map[[2]string]int) {
	st, err := s.cfg.Inbox.Stats(ctx)
	if err != nil {
		d.InboxErr = err.Error()
		return
	}
	d.InboxStats = st
	for _, c := range st {
		switch c.State {
		case inbox.StatePending, inbox.StateRunning:
			d.Backlog += c.Count
		}
		if c.State == inbox.StatePending {
			d.OldestAge = c.Oldest
		}
	}
	var after int64
	for read := 0; read < deadScan; {
		rows, err := s.cfg.Inbox.List(ctx, inbox.ListRequest{State: inbox.StateDead, AfterID: after, Limit: min(inbox.MaxBatch, deadScan-read)})
		if err != nil {
			d.InboxErr = err.Error()
			return
		}
		for _, row := range rows {
			reasons[[2]string{"inbox", cmp.Or(string(row.DeadReason), "(none)")}]++
		}
		read += len(rows)
		if len(rows) == 0 {
			return
		}
		after = rows[len(rows)-1].ID
	}
}

// Chart colours (SVG presentation attributes, which the CSP allows).
const (
	colorOK      = "#2f855a"
	colorRunning = "#2b6cb0"
	colorBad     = "#c53030"
	colorWarn    = "#b7791f"
	colorMuted   = "#718096"
)

type bar struct {
	Label string
	N     int
	Color string
}

// hbars is a horizontal bar chart as inline SVG.
func hbars(bars []bar) template.HTML {
	const width, labelW, rowH = 520, 220, 22
	top := 1
	for _, b := range bars {
		top = max(top, b.N)
	}
	var sb strings.Builder
	h := rowH*len(bars) + 4
	fmt.Fprintf(&sb, `<svg class="chart" role="img" viewBox="0 0 %d %d" width="%d" height="%d" xmlns="http://www.w3.org/2000/svg">`, width, h, width, h)
	for i, b := range bars {
		y := i*rowH + 2
		bw := (width - labelW - 60) * b.N / top
		if b.N > 0 {
			bw = max(bw, 2)
		}
		fmt.Fprintf(&sb, `<text x="%d" y="%d" text-anchor="end" font-size="12" fill="#2d3748">%s</text>`, labelW-6, y+15, template.HTMLEscapeString(cut(b.Label, 40)))
		fmt.Fprintf(&sb, `<rect x="%d" y="%d" width="%d" height="%d" fill="%s"><title>%s: %d</title></rect>`, labelW, y+3, bw, rowH-6, b.Color, template.HTMLEscapeString(b.Label), b.N)
		fmt.Fprintf(&sb, `<text x="%d" y="%d" font-size="12" fill="#2d3748">%d</text>`, labelW+bw+6, y+15, b.N)
	}
	sb.WriteString(`</svg>`)
	return template.HTML(sb.String())
}

// minuteChart is the last hour, one pair of bars a minute (created,
// completed), as inline SVG.
func minuteChart(per [2][60]int) template.HTML {
	const width, height, left, bottom = 620, 150, 40, 20
	top := 1
	for _, s := range per {
		for _, n := range s {
			top = max(top, n)
		}
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, `<svg class="chart" role="img" viewBox="0 0 %d %d" width="%d" height="%d" xmlns="http://www.w3.org/2000/svg">`, width, height, width, height)
	plotH := height - bottom - 10
	fmt.Fprintf(&sb, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#a0aec0"/>`, left, height-bottom, width, height-bottom)
	fmt.Fprintf(&sb, `<text x="%d" y="14" text-anchor="end" font-size="11" fill="#4a5568">%d</text>`, left-4, top)
	fmt.Fprintf(&sb, `<text x="%d" y="%d" text-anchor="end" font-size="11" fill="#4a5568">0</text>`, left-4, height-bottom)
	for _, m := range []int{0, 15, 30, 45, 59} {
		label := fmt.Sprintf("-%dm", 60-m)
		if m == 59 {
			label = "now"
		}
		fmt.Fprintf(&sb, `<text x="%d" y="%d" text-anchor="middle" font-size="11" fill="#4a5568">%s</text>`, left+m*9+4, height-4, label)
	}
	for si, s := range per {
		color := []string{colorRunning, colorOK}[si]
		for m, n := range s {
			if n == 0 {
				continue
			}
			bh := max(plotH*n/top, 1)
			x := left + m*9 + si*4
			what := []string{"created", "completed"}[si]
			fmt.Fprintf(&sb, `<rect x="%d" y="%d" width="4" height="%d" fill="%s"><title>%d %s, minute -%d</title></rect>`, x, height-bottom-bh, bh, color, n, what, 60-m)
		}
	}
	sb.WriteString(`</svg>`)
	return template.HTML(sb.String())
}
