// Package base holds what every pgcoord package shares and no user calls: the sentinel
// errors (re-exported by package pgcoord, where users match them), argument checks that
// produce "pkg: cause" errors wrapping those sentinels, the translation of a standby's
// refusal to ErrReadOnly, and holder identities. It imports nothing of pgcoord's, so
// package pgcoord can build on it too.
package base
