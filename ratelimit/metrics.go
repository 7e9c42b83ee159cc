package ratelimit

import (
	"maps"
	"slices"
	"sync"
	"sync/atomic"
)

// DefaultMaxPolicies is how many policies a Metrics counts one by one by default.
const DefaultMaxPolicies = 1000

// Metrics counts, in this process and per policy, the calls admitted and refused. Pass it
// in Opts.Metrics of the calls it should count, and export it with package metrics
// (metrics.Opts.Ratelimits). An admitted call counts once under each of its policies; a
// refused one once under the policy that refused it. It is safe for concurrent use; its
// zero value is ready to use. Its memory is bounded: past MaxPolicies policies, the others
// are counted together under "" (no policy name is empty).
type Metrics struct {
	// MaxPolicies caps the policies counted one by one. Default DefaultMaxPolicies. Set
	// it before the Metrics is first used.
	MaxPolicies int

	mu       sync.RWMutex
	policies map[string]*policyCounts
}

type policyCounts struct{ allowed, refused atomic.Int64 }

// PolicyCounts are a policy's counts in a Snapshot.
type PolicyCounts struct {
	Policy           string
	Allowed, Refused int64
}

func (m *Metrics) counts(policy string) *policyCounts {
	m.mu.RLock()
	c := m.policies[policy]
	m.mu.RUnlock()
	if c != nil {
		return c
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if c = m.policies[policy]; c != nil {
		return c
	}
	if m.policies == nil {
		m.policies = map[string]*policyCounts{}
	}
	limit := m.MaxPolicies
	if limit <= 0 {
		limit = DefaultMaxPolicies
	}
	if len(m.policies) >= limit {
		policy = ""
		if c = m.policies[""]; c != nil {
			return c
		}
	}
	c = &policyCounts{}
	m.policies[policy] = c
	return c
}

// record counts a decision on limits.
func (m *Metrics) record(d Decision, limits []Limit) {
	if m == nil {
		return
	}
	if !d.Allowed {
		m.counts(d.Policy).refused.Add(1)
		return
	}
	for i, l := range limits {
		if !slices.ContainsFunc(limits[:i], func(o Limit) bool { return o.Policy == l.Policy }) {
			m.counts(l.Policy).allowed.Add(1)
		}
	}
}

// Snapshot returns the counts, by policy name.
func (m *Metrics) Snapshot() []PolicyCounts {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]PolicyCounts, 0, len(m.policies))
	for _, p := range slices.Sorted(maps.Keys(m.policies)) {
		c := m.policies[p]
		out = append(out, PolicyCounts{Policy: p, Allowed: c.allowed.Load(), Refused: c.refused.Load()})
	}
	return out
}
