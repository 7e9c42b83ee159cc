package ui

import (
	"net/http"
	"net/url"
	"strings"
	"unicode/utf8"

	"github.com/pgcoord/pgcoord/internal/base"
)

// param reads the query parameter name: at most base.MaxNameLen bytes of UTF-8 without
// control characters (every name pgcoord stores fits), else a 400 for the page.
func param(q url.Values, name string) (string, error) {
	v := q.Get(name)
	if len(v) > base.MaxNameLen || !utf8.ValidString(v) || strings.ContainsFunc(v, base.IsControl) {
		return "", userErrorf(http.StatusBadRequest, "%s: at most %d bytes of UTF-8 without control characters", name, base.MaxNameLen)
	}
	return v, nil
}

// likePrefix is the LIKE pattern (ESCAPE '\') of the names that start with prefix: its
// wildcards are matched literally.
func likePrefix(prefix string) string {
	r := strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`)
	return r.Replace(prefix) + "%"
}

// pageOf cuts rows, read with a limit one over size, to a page of size rows, and returns
// the After of the next page ("" when there is none).
func pageOf[T any](rows []T, size int, nameOf func(T) string) ([]T, string) {
	if len(rows) <= size {
		return rows, ""
	}
	rows = rows[:size]
	return rows, nameOf(rows[size-1])
}

// detail calls load with the query parameter name, if it is set: the detail of one row
// that a page shows above its list.
func detail[T any](q url.Values, name string, load func(string) (*T, error)) (*T, error) {
	v, err := param(q, name)
	if err != nil || v == "" {
		return nil, err
	}
	return load(v)
}

// pageParams reads a list's ?after= (where its page starts) and ?prefix= (its filter).
func pageParams(q url.Values) (after, prefix string, err error) {
	if after, err = param(q, "after"); err != nil {
		return "", "", err
	}
	prefix, err = param(q, "prefix")
	return after, prefix, err
}

// params reads the query parameters named by dst's keys with param into dst's values.
func params(q url.Values, dst map[string]*string) error {
	for name, v := range dst {
		var err error
		if *v, err = param(q, name); err != nil {
			return err
		}
	}
	return nil
}
