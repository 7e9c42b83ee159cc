package idempotency

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"net/http"
	"strings"
)

// Fingerprint returns the SHA-256 fingerprint of a request: its method, its path (with the
// query string, as in the request line), its body and the values of the headers named in
// headers (names are case-insensitive; a header absent and a header present but empty
// differ). Every field is length-prefixed, so fields can never run together: ("ab", "c")
// and ("a", "bc") have different fingerprints. The middleware computes it for each request;
// callers of Begin without HTTP may use it, or any hash of what identifies their request.
func Fingerprint(method, path string, body []byte, header http.Header, headers ...string) []byte {
	h := sha256.New()
	field(h, "pgcoord-idempotency-fingerprint-v1")
	field(h, method)
	field(h, path)
	count(h, len(headers))
	for _, name := range headers {
		name = http.CanonicalHeaderKey(name)
		field(h, name)
		values, present := header[name]
		if !present {
			count(h, -1)
			continue
		}
		count(h, len(values))
		for _, v := range values {
			field(h, v)
		}
	}
	field(h, string(body))
	return h.Sum(nil)
}

// DerivedKey returns a key derived from (scope, key, step) for another system's own
// idempotency key — the payment provider's Idempotency-Key, a downstream service's request
// id: 64 lower-case hex characters, the SHA-256 of the three length-prefixed fields. It is
// the same on every call, in every process and every retry, so a retry that calls the
// provider again for the same step sends the same key and the provider does the step once;
// and it differs for every other (scope, key, step), so two steps, two keys or two scopes
// never collide. It reveals nothing of the key.
func DerivedKey(scope, key, step string) string {
	h := sha256.New()
	field(h, "pgcoord-idempotency-derived-v1")
	field(h, scope)
	field(h, key)
	field(h, step)
	return hex.EncodeToString(h.Sum(nil))
}

// ParseKey reads the value of an Idempotency-Key header: exactly one Structured Fields
// string as the IETF draft writes it (RFC 8941: "8e03978e-..." with the quotes, \" and \\
// escaped, nothing after the closing quote), or the bare token that Stripe's clients send
// (no quote and no comma: a comma would make it a list). A list of strings ("a", "b"),
// text after the string, a lone quote or another escape is refused. It returns the key,
// validated by ValidateKey; every refusal wraps ErrInvalidKey and pgcoord.ErrInvalidName.
func ParseKey(value string) (string, error) {
	v := strings.Trim(value, " \t")
	if !strings.HasPrefix(v, `"`) {
		if strings.ContainsAny(v, `",`) {
			return "", check.InvalidName("%w: a bare key may have no quote or comma; send one quoted string", ErrInvalidKey)
		}
	} else {
		var b strings.Builder
		closed := false
		for i := 1; i < len(v); i++ {
			c := v[i]
			if closed {
				return "", check.InvalidName("%w: text after the quoted key (one key per request, not a list)", ErrInvalidKey)
			}
			switch {
			case c == '"':
				closed = true
				continue
			case c == '\\':
				if i+1 == len(v) || (v[i+1] != '"' && v[i+1] != '\\') {
					return "", check.InvalidName("%w: a quoted key may escape only \" and \\", ErrInvalidKey)
				}
				i++
				c = v[i]
			}
			b.WriteByte(c)
		}
		if !closed {
			return "", check.InvalidName("%w: the quoted key has no closing quote", ErrInvalidKey)
		}
		v = b.String()
	}
	if err := ValidateKey(v); err != nil {
		return "", err
	}
	return v, nil
}

func field(h hash.Hash, s string) {
	count(h, len(s))
	h.Write([]byte(s))
}

func count(h hash.Hash, n int) {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(int64(n)))
	h.Write(b[:])
}
