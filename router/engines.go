package router

import (
	"slices"

	"github.com/kvroute/kvroute"
)

// candidates is a model's fleet as a decision scores it: every
// data-parallel replica's engines as candidates of their own (each its own
// cache and load, kvroute.Replica.Engines), except a replica whose engines
// were found to ignore the rank header (PinIgnored), which stays one
// candidate: its engines' caches merged (the best overlap of any) and
// their loads summed with its own bookings, since the server, not
// kvroute, picks the engine.
type candidates struct {
	// fleet is the candidates; servers the registered replicas they
	// come from.
	fleet, servers []kvroute.Replica
	// ids is what the index is asked about: candidate i's are
	// ids[from[i]:from[i+1]], its own first.
	ids  []string
	from []int
}

// expand builds the candidates of servers.
func expand(servers []kvroute.Replica) candidates {
	c := candidates{servers: servers, from: make([]int, 1, len(servers)+1)}
	if !slices.ContainsFunc(servers, func(s kvroute.Replica) bool { return s.Ranks() > 1 }) {
		// No data-parallel replica (the common fleet): the servers are the
		// candidates, with no copy of a decision's whole fleet.
		c.fleet = servers
		c.ids = make([]string, len(servers))
		for i, s := range servers {
			c.ids[i] = s.ID
			c.from = append(c.from, i+1)
		}
		return c
	}
	for _, s := range servers {
		if s.Ranks() > 1 && !s.PinIgnored {
			for _, e := range s.Engines() {
				c.fleet = append(c.fleet, e)
				c.ids = append(c.ids, e.ID)
				c.from = append(c.from, len(c.ids))
			}
			continue
		}
		c.fleet = append(c.fleet, s)
		c.ids = append(c.ids, s.ID)
		for rank := range s.Ranks() {
			if s.Ranks() > 1 {
				// A merged replica's engines, after its own entries.
				c.ids = append(c.ids, kvroute.EngineID(s.ID, rank))
			}
		}
		c.from = append(c.from, len(c.ids))
	}
	return c
}

// merged reports whether some candidate stands for several index entries.
func (c candidates) merged() bool { return len(c.ids) != len(c.fleet) }

// candidateIDs is the candidates' own ids, in order.
func (c candidates) candidateIDs() []string {
	if !c.merged() {
		return c.ids
	}
	ids := make([]string, len(c.fleet))
	for i, r := range c.fleet {
		ids[i] = r.ID
	}
	return ids
}

// foldOverlaps is each candidate's overlap from the index's answer for
// ids: the best of its entries.
func (c candidates) foldOverlaps(os []kvroute.Overlap) []kvroute.Overlap {
	if !c.merged() || len(os) != len(c.ids) {
		return os
	}
	out := make([]kvroute.Overlap, len(c.fleet))
	for i := range c.fleet {
		for _, o := range os[c.from[i]:c.from[i+1]] {
			out[i].GPU, out[i].Any, out[i].Approx = max(out[i].GPU, o.GPU), max(out[i].Any, o.Any), max(out[i].Approx, o.Approx)
			if o.Predicted > out[i].Predicted || (o.Predicted == out[i].Predicted && o.Wait < out[i].Wait) {
				out[i].Predicted, out[i].Ready, out[i].Wait = o.Predicted, o.Ready, o.Wait
			}
		}
	}
	return out
}

// foldLoads is each candidate's load from the index's answer for ids: the
// sum of its entries', with the version of its own (what its bookings are
// conditional on).
func (c candidates) foldLoads(ls []kvroute.Load) []kvroute.Load {
	if !c.merged() || len(ls) != len(c.ids) {
		return ls
	}
	out := make([]kvroute.Load, len(c.fleet))
	for i := range c.fleet {
		group := ls[c.from[i]:c.from[i+1]]
		out[i].Version = group[0].Version
		for _, l := range group {
			out[i].PrefillBlocks += l.PrefillBlocks
			out[i].DecodeBlocks += l.DecodeBlocks
			out[i].Requests += l.Requests
			out[i].Waiting += l.Waiting
			out[i].Running += l.Running
			out[i].KVUsage = max(out[i].KVUsage, l.KVUsage)
		}
	}
	return out
}

// server is the registered replica candidate rep is, or is an engine of.
func (c candidates) server(rep kvroute.Replica) kvroute.Replica {
	id := kvroute.ServerID(rep.ID)
	for _, s := range c.servers {
		if s.ID == id {
			return s
		}
	}
	return rep
}
