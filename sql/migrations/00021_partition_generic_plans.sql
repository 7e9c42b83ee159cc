-- A partition handoff (a leave, then the survivor's heartbeat that grants) cost about twice
-- a lease handoff: each of the two calls spent a fifth of its time planning its statements
-- again (PL/pgSQL plans a statement with parameters afresh, custom, on each of its first
-- five calls in a session, and keeps planning custom when the generic plan looks no
-- cheaper). Their statements read one group's rows through indexes and join by hashing
-- (enable_nestloop and enable_seqscan are off in the plan), whatever the values, so one
-- generic plan per session serves every call: 0.78 to 0.64 ms for a leave, 0.82 to 0.68 ms
-- for a granting heartbeat (psql, a group of 2 partitions), and the same plans at 10,000.

-- +goose Up
ALTER FUNCTION pgcoord_partition_plan(text) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION pgcoord_partition_heartbeat(text, text, integer, interval, integer[], boolean) SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION pgcoord_partition_leave(text, text) SET plan_cache_mode = force_generic_plan;

-- +goose Down
ALTER FUNCTION pgcoord_partition_leave(text, text) RESET plan_cache_mode;
ALTER FUNCTION pgcoord_partition_heartbeat(text, text, integer, interval, integer[], boolean) RESET plan_cache_mode;
ALTER FUNCTION pgcoord_partition_plan(text) RESET plan_cache_mode;
