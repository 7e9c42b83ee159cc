package outbox

import "strings"

// reservedHeaders are the header names a message may not carry (compared without regard to
// case): the HTTP sink would send a message's headers as request headers, and these decide
// who the request speaks for (credentials, cookies), how it is framed and routed
// (hop-by-hop and framing headers, Host), or are the sink's own.
var reservedHeaders = map[string]bool{
	"authorization": true, "cookie": true, "host": true, "connection": true, "keep-alive": true,
	"content-length": true, "transfer-encoding": true, "te": true, "trailer": true, "upgrade": true,
	"expect": true, "forwarded": true, "idempotency-key": true,
}

// reservedPrefixes are reserved like reservedHeaders, for every name they begin:
// Proxy-Authorization, Proxy-Connection, ...; X-Forwarded-For, ...; the sink's Pgcoord-Topic, ...
var reservedPrefixes = []string{"proxy-", "x-forwarded-", "pgcoord-"}

// ReservedHeader reports whether a message may not carry a header named name (any case):
// Enqueue and EnqueueBatch refuse such a message, and the webhook sink (outbox/sink) never
// sends such a header from a message. Reserved are the names that carry credentials
// (Authorization, Cookie, Proxy-*), frame or route the request (Host, Connection,
// Keep-Alive, Content-Length, Transfer-Encoding, TE, Trailer, Upgrade, Expect, Forwarded,
// X-Forwarded-*) and the webhook sink's own (Idempotency-Key, Pgcoord-*).
func ReservedHeader(name string) bool {
	n := strings.ToLower(name)
	if reservedHeaders[n] {
		return true
	}
	for _, p := range reservedPrefixes {
		if strings.HasPrefix(n, p) {
			return true
		}
	}
	return false
}
