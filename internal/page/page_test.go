package page_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/pgcoord/pgcoord/internal/page"
)

// source serves 0..total-1 in pages, continuing after the last item it is given.
func source(total int, calls *[]int) func(last *int, limit int) ([]int, error) {
	return func(last *int, limit int) ([]int, error) {
		start := 0
		if last != nil {
			start = *last + 1
		}
		*calls = append(*calls, limit)
		var out []int
		for i := start; i < total && len(out) < limit; i++ {
			out = append(out, i)
		}
		return out, nil
	}
}

func TestCollect(t *testing.T) {
	for _, c := range []struct {
		name             string
		total, max, size int
		want             int
		more             bool
		calls            []int
	}{
		{"all, short last page", 5, -1, 2, 5, false, []int{2, 2, 2}},
		{"all, full last page", 4, -1, 2, 4, false, []int{2, 2, 2}},
		{"more than max", 10, 3, 2, 3, true, []int{2, 2}},
		{"exactly max", 3, 3, 10, 3, false, []int{4}},
		{"empty", 0, 5, 10, 0, false, []int{6}},
	} {
		var calls []int
		got, more, err := page.Collect(c.max, c.size, source(c.total, &calls))
		if err != nil || len(got) != c.want || more != c.more || !slices.Equal(calls, c.calls) {
			t.Errorf("%s: %v, more %v, err %v, page sizes asked %v; want %d items, more %v, sizes %v",
				c.name, got, more, err, calls, c.want, c.more, c.calls)
		}
		for i, v := range got {
			if v != i {
				t.Errorf("%s: item %d is %d: a page did not continue after the last one", c.name, i, v)
			}
		}
	}
	boom := errors.New("boom")
	if _, _, err := page.Collect(-1, 2, func(*int, int) ([]int, error) { return nil, boom }); !errors.Is(err, boom) {
		t.Errorf("error %v, want fetch's", err)
	}
}
