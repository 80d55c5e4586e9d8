package console

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"net/url"
	"strings"
)

// Cookie names.
const (
	sessionCookie = "idem_console_session"
	csrfCookie    = "idem_console_csrf"
)

type csrfKey struct{}

// withCSRF makes sure the browser holds a CSRF cookie and puts its value in
// the request's context for the forms the page renders.
func (s *Server) withCSRF(w http.ResponseWriter, r *http.Request) *http.Request {
	tok := ""
	if c, err := r.Cookie(csrfCookie); err == nil && len(c.Value) == 64 {
		if _, err := hex.DecodeString(c.Value); err == nil {
			tok = c.Value
		}
	}
	if tok == "" {
		b := make([]byte, 32)
		rand.Read(b)
		tok = hex.EncodeToString(b)
		http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: tok, Path: "/", HttpOnly: true,
			SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
		// A POST that arrives without the cookie fails its check below:
		// the new cookie must not make it pass.
		if r.Method == http.MethodPost {
			return r
		}
	}
	return r.WithContext(context.WithValue(r.Context(), csrfKey{}, tok))
}

// csrfToken is the token the page's forms carry.
func csrfToken(r *http.Request) string {
	t, _ := r.Context().Value(csrfKey{}).(string)
	return t
}

// checkCSRF returns why a POST is refused, or "" when it passes: the form's
// token must equal the cookie's, and the request must come from this
// console's own pages (Origin, else Sec-Fetch-Site, when the browser sends
// them).
func (s *Server) checkCSRF(r *http.Request) string {
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if err != nil || u.Host != r.Host {
			return "cross-origin request (Origin " + cut(o, 100) + ")"
		}
	} else if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
		return "cross-site request (Sec-Fetch-Site " + cut(site, 40) + ")"
	}
	want := csrfToken(r)
	got := r.PostForm.Get("csrf")
	if want == "" || subtle.ConstantTimeCompare([]byte(want), []byte(got)) != 1 {
		return "missing or wrong CSRF token"
	}
	return ""
}

// sessionValue is the session cookie's value for the token: an HMAC of the
// token, so the cookie does not hold the token itself.
func sessionValue(token string) string {
	m := hmac.New(sha256.New, []byte(token))
	m.Write([]byte("idem console session v1"))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// equal compares two secrets in constant time, whatever their lengths.
func equal(a, b string) bool {
	ha, hb := sha256.Sum256([]byte(a)), sha256.Sum256([]byte(b))
	return subtle.ConstantTimeCompare(ha[:], hb[:]) == 1
}

// authenticated reports whether r may use the console: always without a
// token; with one, by its bearer token or its session cookie.
func (s *Server) authenticated(r *http.Request) bool {
	if s.cfg.Token == "" {
		return true
	}
	if h := r.Header.Get("Authorization"); h != "" {
		tok, ok := strings.CutPrefix(h, "Bearer ")
		return ok && equal(tok, s.cfg.Token)
	}
	c, err := r.Cookie(sessionCookie)
	return err == nil && equal(c.Value, sessionValue(s.cfg.Token))
}

// who names the user of r for the logs: the token's identity (the first
// hex digits of its SHA-256, never the token) or anonymous.
func (s *Server) who(r *http.Request) string {
	if s.cfg.Token == "" || !s.authenticated(r) {
		return "anonymous"
	}
	h := sha256.Sum256([]byte(s.cfg.Token))
	how := "cookie"
	if r.Header.Get("Authorization") != "" {
		how = "bearer"
	}
	return "token:" + hex.EncodeToString(h[:4]) + " (" + how + ")"
}

type loginData struct {
	Next  string
	Error string
}

// safeNext keeps a post-login redirect on this console: a path, never
// another host.
func safeNext(next string) string {
	if !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.HasPrefix(next, "/\\") ||
		strings.HasPrefix(next, "/login") || len(next) > maxParamBytes {
		return "/"
	}
	return next
}

func (s *Server) loginPage(w http.ResponseWriter, r *http.Request) {
	s.render(w, r, http.StatusOK, "login", loginData{Next: safeNext(r.URL.Query().Get("next"))})
}

// login checks the form's token and sets the session cookie.
func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	next := safeNext(r.PostForm.Get("next"))
	if s.cfg.Token == "" {
		http.Redirect(w, r, next, http.StatusSeeOther)
		return
	}
	if !equal(r.PostForm.Get("token"), s.cfg.Token) {
		s.log.Warn("console: refused", "why", "login with a wrong token", "remote", r.RemoteAddr)
		s.render(w, r, http.StatusUnauthorized, "login", loginData{Next: next, Error: "wrong token"})
		return
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: sessionValue(s.cfg.Token), Path: "/", HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	h := sha256.Sum256([]byte(s.cfg.Token))
	s.log.Info("console: action", "action", "login", "who", "token:"+hex.EncodeToString(h[:4])+" (cookie)", "remote", r.RemoteAddr)
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (s *Server) logout(w http.ResponseWriter, r *http.Request) {
	s.logAction(r, "logout")
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true,
		SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}
