package base

import (
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Redacted is what RedactURL shows in place of a secret.
const Redacted = "REDACTED"

// RedactURL returns raw with its secrets hidden, for an error, a log line or a stored
// last_error: the user information (user and password) and every query value become
// Redacted, and the fragment is dropped. A string that does not parse as a URL is
// replaced as a whole, since it cannot be told which part is secret.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "<unparsable URL, " + Redacted + ">"
	}
	return redactURL(u)
}

func redactURL(u *url.URL) string {
	r := *u
	if r.User != nil {
		r.User = url.User(Redacted)
	}
	if r.RawQuery != "" {
		q := r.Query()
		for k, vs := range q {
			for i := range vs {
				vs[i] = Redacted
			}
			q[k] = vs
		}
		r.RawQuery = q.Encode()
	}
	r.Fragment, r.RawFragment = "", ""
	return r.String()
}

// RedactURLError hides the secrets of the URL an *url.Error names (what net/http's
// client returns, with the request's URL in its text); other errors it returns unchanged.
func RedactURLError(err error) error {
	if ue, ok := err.(*url.Error); ok {
		c := *ue
		c.URL = RedactURL(ue.URL)
		return &c
	}
	return err
}

// Printable returns s with every control character (and invalid UTF-8) escaped as Go
// escapes it (\x1b, \n, \u2028, ...), so text from outside — a name, a stored error, a
// response body — cannot move a terminal's cursor, retitle its window or fake a table row
// when it is printed.
func Printable(s string) string {
	if utf8.ValidString(s) && strings.IndexFunc(s, func(r rune) bool { return !strconv.IsGraphic(r) }) < 0 {
		return s
	}
	q := strconv.QuoteToGraphic(s)
	return q[1 : len(q)-1]
}
