package console

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"sync"
	"time"

	"github.com/outboxref/orders/internal/auth"
)

// cookieName is the session cookie. Its value is a random session id; the
// token that signed in never leaves the sign-in request.
const cookieName = "console_session"

// session is one signed-in operator.
type session struct {
	principal auth.Principal
	// csrf is the synchronizer token every form of this session carries
	// and every POST must send back.
	csrf    string
	expires time.Time
}

// sessions is the server-side session table. It lives in the process: an
// operator signs in again after a restart, or on another instance behind a
// load balancer without sticky sessions.
type sessions struct {
	ttl time.Duration
	now func() time.Time

	mu   sync.Mutex
	byID map[string]*session
}

func newSessions(ttl time.Duration) *sessions {
	return &sessions{ttl: ttl, now: time.Now, byID: map[string]*session{}}
}

func randomToken() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

// create stores a session for p and returns its id.
func (s *sessions) create(p auth.Principal) (string, *session) {
	id := randomToken()
	ss := &session{principal: p, csrf: randomToken(), expires: s.now().Add(s.ttl)}
	s.mu.Lock()
	defer s.mu.Unlock()
	// Expired sessions go when a new one comes: the table stays as small
	// as the number of operators signed in.
	for k, v := range s.byID {
		if !s.now().Before(v.expires) {
			delete(s.byID, k)
		}
	}
	s.byID[id] = ss
	return id, ss
}

// get returns the live session of the request's cookie.
func (s *sessions) get(r *http.Request) (*session, bool) {
	c, err := r.Cookie(cookieName)
	if err != nil || c.Value == "" {
		return nil, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ss, ok := s.byID[c.Value]
	if !ok {
		return nil, false
	}
	if !s.now().Before(ss.expires) {
		delete(s.byID, c.Value)
		return nil, false
	}
	return ss, true
}

func (s *sessions) remove(r *http.Request) {
	if c, err := r.Cookie(cookieName); err == nil {
		s.mu.Lock()
		delete(s.byID, c.Value)
		s.mu.Unlock()
	}
}

// validCSRF compares a form's token with the session's in constant time.
func (ss *session) validCSRF(token string) bool {
	return token != "" && subtle.ConstantTimeCompare([]byte(token), []byte(ss.csrf)) == 1
}

// setCookie writes the session cookie: HttpOnly (no script reads it),
// SameSite=Strict (no other site's page sends it), Secure when the request
// came over TLS, and expiring with the session.
func setCookie(w http.ResponseWriter, r *http.Request, id string, expires time.Time) {
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: id, Path: "/console", Expires: expires,
		MaxAge: int(time.Until(expires).Seconds()), HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
}

func clearCookie(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", Path: "/console", MaxAge: -1,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
}
