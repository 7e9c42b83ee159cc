// Package partition spreads a group's M partitions of work over whichever of its members
// are alive: balanced by weight, sticky, and each partition owned by one member at a time
// under a fence token of its own. It is what teams run Kafka consumer groups, ZooKeeper or
// Helix for ("64 shards, spread over the live workers; when one dies its shards move, when
// one joins it takes its share, and no shard ever has two workers"), on the PostgreSQL
// they already run.
//
// A process joins a group (Join) and keeps a Member until Leave. OnAssign tells it of each
// partition granted to it, with the grant's fence token and a context; OnRevoke of each
// partition that leaves it. KeyPartition maps a key to its partition.
//
// # Assignment
//
// The plan is computed in the database, under the group's row lock, whenever the
// membership changes (a join, a weight change, a leave, an expiry, a drain, a resize), so
// every member reads the same one:
//
//   - Balanced by weight: a member of weight w among members of total weight W gets
//     floor(M*w/W) partitions, and the partitions left over go one each to the members
//     with the largest remainders (then to those holding more, then by name): every
//     member's count is within one of its weighted share M*w/W.
//   - Sticky: a member keeps what it holds (or, while a move to it waits, what it was
//     given), up to its quota, lowest partitions first; only the rest moves, to the members
//     below quota. A member joining a balanced group moves at most its own quota; a member
//     leaving moves only its partitions.
//
// Like Kafka's cooperative-sticky assignor it moves only what must move, and a partition
// is revoked from its owner before it is granted to the next (Kafka does it in two
// rebalance rounds; here the grant simply waits for the release). Unlike Kafka, the plan is
// computed in one place, the database, not by a group leader among the consumers, and it
// weighs members. Helix's full-auto rebalancer balances replicas over live instances with
// a state machine per partition; a partition here has one state, owned or free, and one
// owner.
//
// # Guarantees
//
//   - A partition has at most one live grant at a time, by the database clock: a grant is
//     made only to the member the plan names, and only when the partition is free — its
//     holder released it (after its OnRevoke returned, or RevokeGrace passed) or its grant
//     expired (the holder stopped heartbeating for its TTL). The call that releases a
//     partition (the holder's heartbeat, or its Leave) grants it to its next member in the
//     same transaction; that member reads its grants when the group's notification wakes
//     it, and heartbeats only for partitions still free.
//   - Each grant takes a new fence token, higher than every earlier grant's of the
//     partition, across owners, resizes and failovers (pgcoord's tokens; see package
//     fenced). From the grant on, fenced.Check(ctx, tx, p.Resource(), token) refuses every
//     older token of the partition, even before the new owner writes; Member.Check holds
//     the grant for the caller's transaction (nothing else is granted meanwhile).
//   - A member's partition contexts are cancelled when the partition leaves it: before
//     OnRevoke runs, when the grant is found lost, at Leave, and by the local clock when
//     heartbeats failed for long enough that the grant may have expired.
//   - A resize revokes every grant, and grants nothing under the new count while a grant
//     under the old one lasts: no key is served under two counts at once.
//
// # Failure modes
//
//   - A member that stops (killed, paused, cut off) keeps its partitions until its TTL
//     passes by the database clock; then the next heartbeat of any member (at most a third
//     of the TTL later, or at the expiry itself: members wake when a grant they wait for
//     expires) re-plans and grants them anew.
//   - A paused member that wakes may still run work for a partition that moved: its
//     context was cancelled by the local clock only if the local clock saw the pause.
//     Writes must be fenced (Member.Check, or fenced.Check with p.Resource()); work outside
//     the database needs the token sent along.
//   - Heartbeats of a group are serialized by the group's row: a group with many members
//     re-plans in one transaction per membership change. A Member.Check transaction (or a
//     fenced.Check of a partition's register) left open — its process paused inside it —
//     holds that one partition: it is granted to nobody until the transaction ends (its
//     next owner tries again every thirtieth of its TTL). The group's other partitions,
//     plans and renewals go on.
//   - The grants lapse at their deadline by the member's clock (a TTL after the heartbeat
//     that renewed them was sent), whatever heartbeat is under way. Each heartbeat is given
//     three TTLs to answer, on its connection (a call its context ends closes the
//     connection, and a new one is slower on a busy server: its backend compiles the
//     functions again); a failed one is tried again soon after. A database too slow to
//     answer within the TTL (heartbeats queued on the group's row under load, or a TTL
//     close to a heartbeat's round trip) lets grants lapse before their renewals (the
//     member gives them up, OnRevoke runs), and the group churns while members hold
//     little, until the heartbeats are quick again. Choose a TTL several times the
//     heartbeat's latency at peak.
//   - After an asynchronous failover that lost a grant, use one check per partition:
//     fenced.Check alone (the register keeps the highest token written) or Member.Check
//     alone (the grant row as the new primary has it).
//   - Notifications do not pass a transaction pooler: there members learn of moves at
//     their next heartbeat (a third of the TTL), or at Member.Sync, which heartbeats at
//     once.
package partition
