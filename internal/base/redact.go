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
// Redacted, and the fragment is dropped. A string whose secret part cannot be told for
// sure is replaced as a whole: one that does not parse as a URL with a host, and one with
// an '@' after its host (in the path, query or fragment). That '@' is how a password
// holding a raw '/', '?' or '#' shows up: "https://u:12/pw@host" parses as host "u",
// port 12 and path "/pw@host", so showing the host or path would show the password.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Opaque != "" || u.Host == "" {
		return "<unparsable URL, " + Redacted + ">"
	}
	if AmbiguousURL(raw) {
		return "<ambiguous URL: an '@' after the host (percent-encode one in a password as %40), " + Redacted + ">"
	}
	return redactURL(u)
}

// AmbiguousURL reports whether raw, a URL with an authority ("scheme://..."), has an '@'
// after the authority ends (at the first '/', '?' or '#' after "//"): the mark of a user
// or password holding a raw '/', '?' or '#', which moves part of it into the host, path,
// query or fragment. ("https://u:12/pw@host" is host u, port 12, path /pw@host.)
func AmbiguousURL(raw string) bool {
	i := strings.Index(raw, "//")
	if i < 0 {
		return strings.Contains(raw, "@")
	}
	rest := raw[i+2:]
	if j := strings.IndexAny(rest, "/?#"); j >= 0 {
		return strings.Contains(rest[j:], "@")
	}
	return false
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

// PrintableLines is Printable for text of several lines (a message body, an error that
// quotes one): each line is made printable, and the newlines between them stay.
func PrintableLines(s string) string {
	if !strings.Contains(s, "\n") {
		return Printable(s)
	}
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = Printable(l)
	}
	return strings.Join(lines, "\n")
}
