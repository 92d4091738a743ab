package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
)

// Tagging assigns admission bands and tenants to a workload's requests,
// deterministically, so that a trace without them can exercise
// admission's priorities and fairness. What a trace itself gives (its
// records' priority and tenant fields) always wins.
type Tagging struct {
	// PriorityShare of the requests (those the trace gave no priority),
	// chosen by a permutation seeded with Seed, get Priority; the rest
	// keep 0.
	PriorityShare float64
	Priority      int
	// Tenants share the requests (those the trace gave no tenant) in
	// proportion to their weights, interleaved by smooth weighted round
	// robin in request order, so that every stretch of the workload has
	// the mix (ties go to the tenant listed first).
	Tenants []TenantShare
	Seed    uint64
}

// TenantShare is one tenant's name and weight.
type TenantShare struct {
	Name   string
	Weight float64
}

// Tag applies t to w's requests in place.
func (w *Workload) Tag(t Tagging) error {
	if !(t.PriorityShare >= 0 && t.PriorityShare <= 1) {
		return fmt.Errorf("sim: priority share %v is not in 0..1", t.PriorityShare)
	}
	var free []int
	for i := range w.Requests {
		if !w.Requests[i].fromTracePriority {
			free = append(free, i)
		}
	}
	if n := int(math.Round(t.PriorityShare * float64(len(free)))); n > 0 {
		perm := rand.New(rand.NewPCG(t.Seed, 13)).Perm(len(free))
		for _, j := range perm[:n] {
			w.Requests[free[j]].Priority = t.Priority
		}
	}
	if len(t.Tenants) == 0 {
		return nil
	}
	var total float64
	for _, s := range t.Tenants {
		if !(s.Weight > 0) || math.IsInf(s.Weight, 0) {
			return fmt.Errorf("sim: tenant %q: weight %v must be a finite number > 0", s.Name, s.Weight)
		}
		total += s.Weight
	}
	cur := make([]float64, len(t.Tenants))
	for i := range w.Requests {
		if w.Requests[i].fromTraceTenant {
			continue
		}
		best := 0
		for k, s := range t.Tenants {
			cur[k] += s.Weight
			if cur[k] > cur[best] {
				best = k
			}
		}
		cur[best] -= total
		w.Requests[i].Tenant = t.Tenants[best].Name
	}
	return nil
}

// ParsePriorityShare reads --priority-share: F or F:P (P defaults to -1,
// a band above the default 0).
func ParsePriorityShare(s string) (share float64, prio int, err error) {
	f, p, hasP := strings.Cut(s, ":")
	share, err = strconv.ParseFloat(strings.TrimSpace(f), 64)
	if err != nil || !(share >= 0 && share <= 1) {
		return 0, 0, fmt.Errorf("sim: priority share %q: want a fraction in 0..1, optionally :PRIORITY", s)
	}
	prio = -1
	if hasP {
		if prio, err = strconv.Atoi(strings.TrimSpace(p)); err != nil {
			return 0, 0, fmt.Errorf("sim: priority share %q: priority: %w", s, err)
		}
	}
	return share, prio, nil
}

// ParseTenants reads --tenants: NAME=W,NAME=W (each name once).
func ParseTenants(s string) ([]TenantShare, error) {
	var out []TenantShare
	seen := map[string]bool{}
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		name, v, ok := strings.Cut(f, "=")
		if !ok || name == "" {
			return nil, fmt.Errorf("sim: tenant %q: want NAME=WEIGHT", f)
		}
		if seen[name] {
			return nil, fmt.Errorf("sim: tenant %q given twice", name)
		}
		seen[name] = true
		wt, err := strconv.ParseFloat(v, 64)
		if err != nil || !(wt > 0) || math.IsInf(wt, 0) {
			return nil, fmt.Errorf("sim: tenant %s: weight %q must be a number > 0", name, v)
		}
		out = append(out, TenantShare{Name: name, Weight: wt})
	}
	return out, nil
}
