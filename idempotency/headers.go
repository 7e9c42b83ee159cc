package idempotency

import (
	"net/http"
	"slices"
	"strings"
	"unicode/utf8"
)

// checkHeaders refuses response headers the store cannot keep, before any SQL runs: a
// name or value with a NUL byte (a jsonb string cannot hold one), or headers whose JSON
// text, as PostgreSQL prints the stored jsonb, is over MaxStoredHeaderBytes — the bound
// pgcoord_idempotency_complete enforces.
func checkHeaders(h http.Header) error {
	for name, values := range h {
		if strings.IndexByte(name, 0) >= 0 || slices.ContainsFunc(values, func(v string) bool { return strings.IndexByte(v, 0) >= 0 }) {
			return check.Invalid("response header %q has a NUL byte, which the store cannot keep", name)
		}
	}
	if n := headersTextLen(h); n > MaxStoredHeaderBytes {
		return check.Invalid("%w: the stored response headers take %d bytes, more than the maximum of %d",
			ErrTooLarge, n, MaxStoredHeaderBytes)
	}
	return nil
}

// headersTextLen returns the length of h stored as jsonb and printed back by PostgreSQL
// (octet_length(headers::text)): Complete sends json.Marshal(h), PostgreSQL stores the
// decoded strings and prints them in its own format, {"Name": ["value", "value"], ...}.
func headersTextLen(h http.Header) int {
	n := len("{}")
	first := true
	for name, values := range h {
		if !first {
			n += len(", ")
		}
		first = false
		n += jsonTextLen(name) + len(": ")
		if values == nil {
			n += len("null")
			continue
		}
		n += len("[]")
		for i, v := range values {
			if i > 0 {
				n += len(", ")
			}
			n += jsonTextLen(v)
		}
	}
	return n
}

// jsonTextLen returns the length of s as a JSON string that PostgreSQL prints (escape_json),
// after json.Marshal replaced each byte of invalid UTF-8 with U+FFFD.
func jsonTextLen(s string) int {
	n := len(`""`)
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		i += size
		switch {
		case r == utf8.RuneError && size == 1:
			n += len("\uFFFD")
		case r == '"' || r == '\\' || r == '\b' || r == '\f' || r == '\n' || r == '\r' || r == '\t':
			n += 2 // \" \\ \b \f \n \r \t
		case r < ' ':
			n += len(`\u0001`)
		default:
			n += size
		}
	}
	return n
}
