"""KV admission: whether a pool's KV cache and batch slots still have room for a request's
tier, held in one ledger per pool, with a wait in the waiting room when the pool is full.

What lives here:
- `capacity`      the pure arithmetic: a request's KV footprint, a pool's capacity and each
                  tier's share of it, the footprint ratio learned from the engines, the
                  blocked heads of line (`KvLedger`, `PoolView`, `HeadBoard`).
- `book`          what the step asks of a ledger (`KvBook`), a process's own (`LocalBook`)
                  and the fleet's shared one with failover to a local share (`FailoverBook`).
- `step`          the admission chain's KV step (`KvStep`): hold, wait, release, settle.
- `redis_ledger`  the fleet's ledger in Redis (`RedisBook`) and the replicas' heartbeats
                  (`FleetMembers`): the one module of admission that does I/O (the
                  import-linter contracts name it; only the process wiring imports it).
- `lua/kv_*.lua`  the ledger's scripts, the same arithmetic as `capacity` (one test suite
                  holds both); their prelude `time.lua` is budget/lua/'s, one copy for all.
"""
