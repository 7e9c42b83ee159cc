package base_test

import (
	"strings"
	"testing"

	"github.com/pgcoord/pgcoord/internal/base"
)

// A password with '@', ':', '/', '?' or '#' in it, raw or percent-encoded, never shows in
// what RedactURL returns, nor does any part of it: a raw '/', '?' or '#' makes the password
// parse as a host, a port or a path, so such a URL is hidden whole.
func TestRedactURLHidesAwkwardPasswords(t *testing.T) {
	t.Parallel()
	for _, pw := range []string{"Xq@Wv", "Xq:Wv", "Xq/Wv", "1234/Wv", "12?Wv", "12#Wv", "Xq@Wv:Yz/Uk", "Xq/Wv@Yz"} {
		for _, enc := range []string{pw, escape(pw)} {
			raw := "https://alice:" + enc + "@hooks.example/in/x?api_key=k3y&v=1"
			got := base.RedactURL(raw)
			for _, part := range secretParts(pw) {
				if strings.Contains(got, part) {
					t.Errorf("RedactURL(%q) = %q: shows %q of the password", raw, got, part)
				}
			}
			if strings.Contains(got, "k3y") || strings.Contains(got, "alice") {
				t.Errorf("RedactURL(%q) = %q: shows the user or a query value", raw, got)
			}
			if enc != pw || !strings.ContainsAny(pw, "/?#") {
				if !strings.Contains(got, "hooks.example/in/x") { // parsed for sure: the host and path stay
					t.Errorf("RedactURL(%q) = %q: lost the host and path", raw, got)
				}
			}
		}
	}
	for _, raw := range []string{"host=db password=s3cret", "alice:s3cret@hooks.example/in", "//alice:s3cret@/x"} {
		if got := base.RedactURL(raw); strings.Contains(got, "s3cret") {
			t.Errorf("RedactURL(%q) = %q", raw, got)
		}
	}
}

// escape percent-encodes the characters of a password that a URL gives a meaning.
func escape(pw string) string {
	return strings.NewReplacer("@", "%40", ":", "%3A", "/", "%2F", "?", "%3F", "#", "%23").Replace(pw)
}

// secretParts are the pieces a misparse could show: the password's runs between its
// special characters, in either form.
func secretParts(pw string) []string {
	parts := []string{pw, escape(pw)}
	for _, p := range strings.FieldsFunc(pw, func(r rune) bool { return strings.ContainsRune("@:/?#", r) }) {
		parts = append(parts, p)
	}
	return parts
}

// Text printed from outside is escaped line by line: the lines stay, ESC does not.
func TestPrintableLines(t *testing.T) {
	t.Parallel()
	got := base.PrintableLines("a\x1b[2J\nb\tc\r\n")
	if got != `a\x1b[2J`+"\n"+`b\tc\r`+"\n" {
		t.Fatalf("PrintableLines = %q", got)
	}
}
