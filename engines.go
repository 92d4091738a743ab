package kvroute

import (
	"fmt"
	"strconv"
	"strings"
)

// EngineSep joins a replica's ID and an engine's rank in the engine's ID
// ("r1/2"). It is not valid in a registered ID, so that an engine ID never
// names a registered replica, and it is safe in the store's keys.
const EngineSep = "/"

// EngineID is the ID of rank's engine of the replica registered as id: what
// the index, loads, leases and event followers know a data-parallel
// engine by.
func EngineID(id string, rank int) string { return id + EngineSep + strconv.Itoa(rank) }

// SplitEngineID splits an engine ID into its replica's ID and its rank; ok
// is false (and replica is id) for the ID of a replica that is not an
// engine of a data-parallel one.
func SplitEngineID(id string) (replica string, rank int, ok bool) {
	i := strings.LastIndex(id, EngineSep)
	if i < 0 {
		return id, 0, false
	}
	n, err := strconv.Atoi(id[i+1:])
	if err != nil || n < 0 || n >= MaxDataParallelSize {
		return id, 0, false
	}
	return id[:i], n, true
}

// ServerID is the registered replica an ID names: the replica itself, or
// the replica an engine ID belongs to. Registry writes (health, block
// size, followed) go to it, since engines are not registered.
func ServerID(id string) string {
	r, _, _ := SplitEngineID(id)
	return r
}

// Ranks is how many data-parallel engines serve behind the replica (at
// least 1).
func (r Replica) Ranks() int { return max(1, r.DataParallelSize) }

// Rank is the data-parallel rank of an engine returned by Engines; ok is
// false for a registered replica.
func (r Replica) Rank() (rank int, ok bool) {
	_, rank, ok = SplitEngineID(r.ID)
	return rank, ok
}

// Engines expands a data-parallel replica into its engines, one Replica
// each, as vLLM lays them out: ID EngineID(r.ID, rank), the same URL (vLLM
// routes a request to a rank by its X-data-parallel-rank header), and the
// events and replay ports offset by the rank. A replica of one engine is
// returned as it is. An endpoint whose port cannot be offset (Validate
// refuses such a replica) is left empty: the engine is then routed on
// approximate entries, never on another engine's stream.
func (r Replica) Engines() []Replica {
	if r.DataParallelSize <= 1 {
		return []Replica{r}
	}
	out := make([]Replica, r.DataParallelSize)
	for rank := range out {
		e := r
		e.ID = EngineID(r.ID, rank)
		e.DataParallelSize = 0
		e.Events, _ = OffsetPort(r.Events, rank)
		e.Replay, _ = OffsetPort(r.Replay, rank)
		out[rank] = e
	}
	return out
}

// OffsetPort adds by to the port of a tcp://host:port endpoint (empty
// stays empty), as vLLM offsets a data-parallel engine's KV-event ports by
// its rank.
func OffsetPort(endpoint string, by int) (string, error) {
	if endpoint == "" || by == 0 {
		return endpoint, nil
	}
	i := strings.LastIndexByte(endpoint, ':')
	if i < 0 {
		return "", fmt.Errorf("endpoint %q has no port", endpoint)
	}
	port, err := strconv.Atoi(endpoint[i+1:])
	if err != nil || port <= 0 || port+by > 65535 {
		return "", fmt.Errorf("endpoint %q: port cannot be offset by %d", endpoint, by)
	}
	return endpoint[:i+1] + strconv.Itoa(port+by), nil
}
