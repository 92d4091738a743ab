// Package sim replays request traces against a discrete-event model of a
// fleet of vLLM-class engines, deciding every request through the service's
// own decision core (router.Decide, fed by RouterView), so that operators can compare policies (hit rate and load balance as a
// pair) and tune the kv weights on their own traffic before deploying.
//
// The engine model, per replica:
//
//   - A KV cache of Config.CapacityBlocks blocks. A running request pins
//     its prompt blocks plus ceil(output/block) anonymous blocks; blocks
//     nobody pins form an LRU that admissions evict from. A finished
//     request releases its prompt tail first, so its head blocks are the
//     most recent (vLLM's free-queue order). Decode keys (Request.DecodeKeys)
//     are cached when the request finishes.
//   - A FIFO waiting queue. The head is admitted when the prefill slot is
//     free, fewer than MaxBatch requests run, and its blocks fit (an engine
//     with nothing running admits anything). Cache hits are counted at
//     admission: the leading prompt blocks the cache holds then.
//   - One prefill at a time at PrefillTPS over the uncached prompt tokens
//     (at least one token); the first token is emitted when it ends.
//   - Decode at DecodeTPS per request, concurrently for every running
//     request. By default decode does not slow prefill or other decodes;
//     with DecodeSlowdown it is bandwidth-bound instead: every decoding
//     request on a replica runs at DecodeTPS/(1+DecodeSlowdown*u), u the
//     share of the cache that replica's decoding requests hold, recomputed
//     whenever one starts or ends decoding. Decode never slows prefill:
//     this is the model's biggest simplification, since in a real engine a
//     large decode batch steals step time from prefill.
//   - Cache events: BlockStored for the blocks a request inserted, when its
//     prefill ends (and for decode keys at completion); BlockRemoved at
//     eviction. Each batch reaches the router's index after EventDelay,
//     unless lost (EventLoss) or a removal with DropRemovals set.
//
// The router side keeps an index fed only by those events (and, with
// RecordDecisions, approximate entries from its own dispatches), and a load
// view booked like router/'s leases: at decision, prefill = prompt blocks
// minus believed matched blocks and decode = output blocks (DecodeBooking
// "active": prompt plus output blocks, for comparison) and one request; prefill is
// released at first token, the rest at completion. Every decision calls
// router.Decide over that view with a seeded *rand.Rand, as the service does
// over Redis (tests/equivalence_test.go holds the two to the same picks).
//
// Everything is event driven (container/heap, ties in insertion order) and
// seeded, so a run is a pure function of its inputs: the same Config,
// scoring.Config and Workload give byte-identical Report JSON.
//
// Workloads: Mooncake JSONL traces (LoadMooncake; each hash_id is a block
// key, a request's session is its first hash_id), the seed's herding batch
// (Herding) and stale-index replay (StaleIndex), and closed-loop agentic
// sessions (Agentic). See README.md for the metrics and the JSON format.
package sim
