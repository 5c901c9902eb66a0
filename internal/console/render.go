package console

import (
	"bytes"
	"encoding/json"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// page is what every template receives: the page's own data and what the
// layout needs.
type page struct {
	Title     string
	Principal string
	Role      string
	// CanWrite is false for a viewer and when the console is read only:
	// no write control is rendered.
	CanWrite bool
	ReadOnly bool
	CSRF     string
	Static   string // /console/static/<version>
	Grafana  string
	Data     any
}

// parsePages parses each page template with the layout. A template
// error is a build defect: the templates are embedded.
func parsePages(funcs template.FuncMap) map[string]*template.Template {
	names, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil {
		panic(err)
	}
	out := map[string]*template.Template{}
	for _, n := range names {
		base := strings.TrimSuffix(strings.TrimPrefix(n, "templates/"), ".html")
		if base == "layout" {
			continue
		}
		out[base] = template.Must(template.New(base).Funcs(funcs).ParseFS(templateFS, "templates/layout.html", n))
	}
	return out
}

func (c *Console) funcs() template.FuncMap {
	return template.FuncMap{
		"ago": func(t time.Time) string {
			if t.IsZero() {
				return "-"
			}
			return time.Since(t).Round(time.Second).String()
		},
		"when": func(t any) string {
			switch v := t.(type) {
			case time.Time:
				if v.IsZero() {
					return "-"
				}
				return v.UTC().Format("2006-01-02 15:04:05Z")
			case *time.Time:
				if v == nil || v.IsZero() {
					return "-"
				}
				return v.UTC().Format("2006-01-02 15:04:05Z")
			}
			return fmt.Sprint(t)
		},
		"json": func(v any) string {
			b, err := json.MarshalIndent(v, "", "  ")
			if err != nil {
				return err.Error()
			}
			return string(b)
		},
		"rawjson": func(b []byte) string {
			var buf bytes.Buffer
			if json.Indent(&buf, b, "", "  ") != nil {
				return string(b)
			}
			return buf.String()
		},
		"query": url.QueryEscape,
		"deref": func(p any) any {
			switch v := p.(type) {
			case *int32:
				if v == nil {
					return "-"
				}
				return *v
			case *int64:
				if v == nil {
					return "-"
				}
				return *v
			}
			return p
		},
		// mailpit links to a search of the demo's SMTP sink (Mailpit's
		// web UI) for a text, such as an order id.
		"mailpit": func(text string) string {
			if c.cfg.MailpitURL == "" || text == "" {
				return ""
			}
			return strings.TrimRight(c.cfg.MailpitURL, "/") + "/search?q=" + url.QueryEscape(text)
		},
		// mailpitMessage links to Mailpit's search for one Message-ID
		// (its "message-id:" filter matches the ID without its angle
		// brackets).
		"mailpitMessage": func(messageID string) string {
			id := strings.Trim(messageID, "<>")
			if c.cfg.MailpitURL == "" || id == "" {
				return ""
			}
			return strings.TrimRight(c.cfg.MailpitURL, "/") + "/search?q=" + url.QueryEscape("message-id:"+id)
		},
		"traceLink": func(traceID string) string {
			if c.cfg.TraceURL == "" || traceID == "" {
				return ""
			}
			return strings.ReplaceAll(c.cfg.TraceURL, "{trace_id}", url.PathEscape(traceID))
		},
		"pct": func(done, total int) int {
			if total == 0 {
				return 100
			}
			return done * 100 / total
		},
	}
}

// render writes a page; ss is nil on the sign-in page and errors before
// sign-in.
func (c *Console) render(w http.ResponseWriter, r *http.Request, ss *session, status int, name string, data any) {
	t, ok := c.pages[name]
	if !ok {
		panic("console: no template " + name)
	}
	p := page{Title: name, Static: "/console/static/" + c.version, Grafana: c.cfg.GrafanaURL, ReadOnly: c.cfg.ReadOnly, Data: data}
	if ss != nil {
		p.Principal, p.Role, p.CSRF = ss.principal.Subject, string(ss.principal.Role), ss.csrf
		p.CanWrite = ss.principal.Role.CanWrite() && !c.cfg.ReadOnly
	}
	var buf bytes.Buffer
	if err := t.ExecuteTemplate(&buf, "layout", p); err != nil {
		c.cfg.Log.ErrorContext(r.Context(), "console template failed", "page", name, "error", err.Error())
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// renderFragment writes one named template without the layout (the
// overview's refresh).
func (c *Console) renderFragment(w http.ResponseWriter, r *http.Request, name, block string, data any) {
	var buf bytes.Buffer
	if err := c.pages[name].ExecuteTemplate(&buf, block, page{Data: data, Static: "/console/static/" + c.version}); err != nil {
		c.cfg.Log.ErrorContext(r.Context(), "console template failed", "page", name, "error", err.Error())
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_, _ = w.Write(buf.Bytes())
}

// fail shows an error page with status.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, ss *session, status int, msg string) {
	c.render(w, r, ss, status, "error", map[string]any{"Status": status, "StatusText": http.StatusText(status), "Message": msg})
}

// failErr maps an operation's error to a page: the operations' own
// errors are the operator's to read; anything else is logged.
func (c *Console) failErr(w http.ResponseWriter, r *http.Request, ss *session, err error) {
	status, msg := statusOf(err)
	if status == http.StatusInternalServerError {
		c.cfg.Log.ErrorContext(r.Context(), "console request failed", "path", r.URL.Path, "error", err.Error())
	}
	c.fail(w, r, ss, status, msg)
}
