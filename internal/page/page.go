// Package page reads a paged List of pgcoord's — leases, semaphore keys, jobs, idempotency
// keys, audit entries — until the caller has what it asked for.
package page

import "math"

// Collect calls fetch for pages of at most size items until it has max items (max < 0 or
// math.MaxInt: all of them) or a page comes back short, and returns the items, at most max,
// and whether there were more. fetch gets the last item of the previous page (nil for the
// first page), to continue after it, and the page size to ask for. Collect reads one item
// more than max to know whether there are more. It returns fetch's first error.
func Collect[T any](max, size int, fetch func(last *T, limit int) ([]T, error)) (items []T, more bool, err error) {
	want := math.MaxInt
	if max >= 0 && max < math.MaxInt {
		want = max + 1
	}
	items = []T{}
	var last *T
	for len(items) < want {
		n := min(want-len(items), size)
		got, err := fetch(last, n)
		if err != nil {
			return nil, false, err
		}
		items = append(items, got...)
		if len(got) < n {
			break
		}
		l := items[len(items)-1]
		last = &l
	}
	if want != math.MaxInt && len(items) > max {
		return items[:max], true, nil
	}
	return items, false, nil
}
