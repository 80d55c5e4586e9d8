package console

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// page is what every template gets: the layout's data and the page's own.
type page struct {
	Title     string
	Nav       string
	CSRF      string
	ReadOnly  bool
	Auth      bool
	LoggedIn  bool
	StoreName string
	HasInbox  bool
	HasDLQ    bool
	Data      any
}

// pageNames are the templates under assets/, each rendered inside
// layout.html.
var pageNames = []string{"overview", "keys", "record", "inbox", "row", "confirm", "dlq", "dlqlist", "dlqmessage", "login", "error"}

var funcs = template.FuncMap{
	"time":    fmtTime,
	"ago":     ago,
	"dur":     fmtDur,
	"join":    strings.Join,
	"query":   query,
	"shown":   shown,
	"percent": func(n, total int) int { return n * 100 / max(total, 1) },
}

func (s *Server) parsePages() error {
	s.pages = map[string]*template.Template{}
	for _, name := range pageNames {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(assets, "assets/layout.html", "assets/"+name+".html")
		if err != nil {
			return fmt.Errorf("console: template %s: %w", name, err)
		}
		s.pages[name] = t
	}
	return nil
}

var titles = map[string]string{"overview": "Overview", "keys": "Keys", "record": "Record", "inbox": "Inbox", "row": "Inbox row",
	"confirm": "Confirm", "dlq": "Dead letters", "dlqlist": "Dead letters", "dlqmessage": "Dead letter", "login": "Log in", "error": "Error"}

var navs = map[string]string{"overview": "overview", "keys": "keys", "record": "keys", "inbox": "inbox", "row": "inbox",
	"confirm": "inbox", "dlq": "dlq", "dlqlist": "dlq", "dlqmessage": "dlq"}

// render writes page name with data and status code.
func (s *Server) render(w http.ResponseWriter, r *http.Request, code int, name string, data any) {
	p := page{Title: titles[name], Nav: navs[name], CSRF: csrfToken(r), ReadOnly: s.cfg.ReadOnly, Auth: s.cfg.Token != "",
		StoreName: s.cfg.StoreName, HasInbox: s.cfg.Inbox != nil, HasDLQ: len(s.cfg.DeadLetters) > 0, Data: data}
	p.LoggedIn = p.Auth && name != "login" && s.authenticated(r)
	var buf bytes.Buffer
	if err := s.pages[name].Execute(&buf, p); err != nil {
		s.log.Error("console: render", "page", name, "err", err)
		http.Error(w, "console: cannot render the page", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(code)
	w.Write(buf.Bytes())
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

// ago is how long before now t was, for people.
func ago(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t)
	if d < 0 {
		return "in " + fmtDur(-d)
	}
	return fmtDur(d) + " ago"
}

func fmtDur(d time.Duration) string {
	switch {
	case d <= 0:
		return "-"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	case d < 48*time.Hour:
		return d.Round(time.Minute).String()
	}
	return fmt.Sprintf("%dd%dh", d/(24*time.Hour), d%(24*time.Hour)/time.Hour)
}

// query builds a query string from name, value pairs, leaving out empty
// values.
func query(kv ...any) template.URL {
	q := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		v := fmt.Sprint(kv[i+1])
		if v != "" {
			q.Set(fmt.Sprint(kv[i]), v)
		}
	}
	return template.URL(q.Encode())
}

// shownBytes is a body, result or payload as a page shows it.
type shownBytes struct {
	Text   string
	Binary bool
	Size   int
	Cut    int // bytes not shown
}

// shown renders b as text when it is printable UTF-8, else as a hex dump,
// at most maxShownBytes of it.
func shown(b []byte) shownBytes {
	s := shownBytes{Size: len(b)}
	part := b
	if len(part) > maxShownBytes {
		part = part[:maxShownBytes]
	}
	for i := 0; i < utf8.UTFMax && len(part) > 0 && !utf8.Valid(part); i++ {
		part = part[:len(part)-1]
	}
	text := string(part)
	printable := utf8.ValidString(text)
	for _, r := range text {
		if !printable {
			break
		}
		printable = unicode.IsPrint(r) || r == '\n' || r == '\t' || r == '\r'
	}
	if !printable {
		part = b[:min(len(b), maxShownBytes/4)]
		text = hex.Dump(part)
		s.Binary = true
	}
	s.Text = text
	s.Cut = len(b) - len(part)
	return s
}

// errorData is the error page.
type errorData struct {
	Status     int
	StatusText string
	Message    string
}
