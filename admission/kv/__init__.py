"""KV admission: whether a pool's KV cache and batch slots still have room for a request's
tier, held in one ledger per pool, with a wait in the waiting room when the pool is full.

What lives here:
- `capacity`      the pure arithmetic: a request's KV footprint, a pool's capacity and each
                  tier's share of it, the footprint ratio learned from the engines, the
                  blocked heads of line (`KvLedger`, `PoolView`, `HeadBoard`).
- `book`          what the step and the dispatcher ask of a ledger (`KvBook`), a process's
                  own (`LocalBook`) and the fleet's shared one with failover to a local
                  share (`FailoverBook`).
- `step`          the admission chain's KV step (`KvStep`): each request's hold — held on
                  arrival, or waiting in the room until offered one — released, settled,
                  expired.
- `dispatch`      the waiting room's dispatch (`RoomDispatcher`): offers the room to the
                  ledger on the events that free it and on its tick, holds a pool for a
                  blocked head only while its room is about to come, and shares the heads
                  and the tenants' attained service with the fleet.
- `redis_ledger`  the fleet's ledger in Redis (`RedisBook`) and the replicas' heartbeats
                  (`FleetMembers`): the one module of admission that does I/O (the
                  import-linter contracts name it; only the process wiring imports it).
- `lua/kv_*.lua`  the ledger's scripts, the same arithmetic as `capacity` (one test suite
                  holds both); their prelude `time.lua` is budget/lua/'s, one copy for all.
"""
