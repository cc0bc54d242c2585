"""Every limit and timing of the core, named (STYLE.md: put a limit on everything)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Final

MS: Final = 1_000_000  # nanoseconds per millisecond


@dataclass(frozen=True, slots=True)
class Settings:
    """The servers' settings: a cluster file's ``[settings]`` overrides them. Each field's
    comment is its entry in docs/configuration.md (``store/config_reference.py``)."""

    # Largest key, in UTF-8 bytes.
    key_bytes_max: int = 1024
    # Largest value, as encoded (about its msgpack size).
    value_bytes_max: int = 1 << 20
    # Largest client request a server takes (a SUBMIT, its procedure arguments included).
    request_bytes_max: int = 4 << 20
    # Operations in one operation list.
    ops_per_txn_max: int = 1024
    # Keys and ranges one transaction may read, over all its batches.
    reads_per_txn_max: int = 10_000
    # Largest limit of one scan.
    scan_limit_max: int = 10_000
    # Arguments of one procedure call.
    procedure_args_max: int = 64
    # Transactions a coordinator runs at once; past it new submissions get UNAVAILABLE.
    txns_in_flight_max: int = 4096
    # Speculation (DESIGN.md §3, Mako): certified writes are visible at once. Off, a
    # participant keeps its locks and hides new versions until the transaction is committed,
    # and the client hears nothing before commit (the "OCC+OR" baseline of the ablation).
    speculation: bool = True
    # Snapshot reads (store/core/coordinator.py, "snapshot reads"): a read-only operation
    # list whose keys are all on one shard reads the newest versions whose writers'
    # records are durable there, so it does not wait for writers still being replicated.
    # Off: it reads the newest versions and waits for their commit (on geo3 at 50 ms about
    # 1% of the read-only transactions did, 27 ms each on average, 2026-12-06).
    snapshot_reads: bool = True
    # Sparse clocks (DESIGN.md §4): drop entries at or below the known vector watermark.
    # Off only to measure what dropping saves (bench/vc_metadata.py).
    sparse_clocks: bool = True
    # Retransmission of certification requests between shard leaders when a reply is lost.
    peer_retry_ns: int = 20 * MS
    # Lock/validate attempts before the coordinator gives up and aborts (safe: undecided).
    peer_attempts_max: int = 50
    # A participant aborts on its own a transaction that has held its locks this long
    # without being asked to vote (validate): its coordinator is dead, cut off or stuck,
    # and a counter left unsettled would hold back this shard's watermark, and with it
    # every commit here, until an epoch change. Once it has voted yes it waits (2PC).
    lock_timeout_ns: int = 500 * MS
    # Watermark gossip between shard leaders (DESIGN.md §4): every interval a leader sends
    # what it knows of every shard's watermark to gossip_fanout peers, round robin, so
    # knowledge spreads epidemically at O(S * fanout) messages per interval, not O(S^2).
    # A leader whose vector watermark has not moved since its last gossip stays silent
    # until gossip_idle_interval_ns after it (a refresh, for a peer that restarted).
    gossip_interval_ns: int = 5 * MS
    gossip_idle_interval_ns: int = 100 * MS
    gossip_fanout: int = 8
    # When this shard's own watermark rises (a stream entry chosen), the next gossip goes at
    # once, not up to gossip_interval_ns later: a coordinator whose transaction waits on this
    # shard learns it is durable sooner (on the commit path of cross-shard transactions). At
    # most one such gossip per this spacing.
    gossip_push_spacing_ns: int = 1 * MS
    # A worker of a shard of several, without followers and without a watermark board
    # shared with its fellows (a worker a failover promoted away from its machine; workers
    # started together share one, SharedWatermarks), tells its fellows of another shard's
    # entry it heard of in a reply at once, at most once per this spacing: the shard's
    # transactions are spread over its workers, so each hears from other shards 1/W as
    # often. (With followers every install pushes gossip, fellows included.)
    fellow_gossip_spacing_ns: int = MS // 2
    # Failure detection (docs/recovery.md): every replica heartbeats to the configuration
    # manager each heartbeat_interval_ns; a shard leader silent for leader_timeout_ns is
    # replaced. A CM member takes the CM over after cm_timeout_ns (times its rank) without
    # hearing the CM's leader. Scale these with the round trip between regions.
    heartbeat_interval_ns: int = 100 * MS
    leader_timeout_ns: int = 1000 * MS
    cm_timeout_ns: int = 1000 * MS
    # Leader leases (docs/recovery.md "Stale reads"): a replicated leader tells a client
    # COMMITTED, or serves another shard's read, only for reads it made less than
    # leader_lease_ns after proposing an entry a majority then accepted; a new leader tells
    # no client COMMITTED until leader_lease_ns (and a tenth more, for clock rates) after
    # its phase 1. So a deposed leader that does not know it yet serves no stale read to a
    # client that already heard of a newer commit. The stream's heartbeats (at most
    # heartbeat_idle_interval_ns apart, StreamSettings) keep a healthy leader's lease fresh.
    leader_lease_ns: int = 300 * MS
    # State transfer to a restarted replica (docs/recovery.md "Rejoining"): the size of one
    # piece, and how long a transfer may go without progress before the next source is asked.
    transfer_piece_bytes: int = 256 << 10
    transfer_retry_ns: int = 1000 * MS
    # Garbage collection of versions nobody can read.
    gc_interval_ns: int = 50 * MS
    # Keys one garbage-collection pass visits at most, so a pass never stalls the server.
    gc_keys_per_pass_max: int = 2000
    # Outcomes a coordinator remembers for client retries (exactly-once), and finished
    # transactions a participant remembers (so a late request for one is refused).
    outcomes_remembered_max: int = 100_000
    finished_txns_remembered_max: int = 100_000

    def with_overrides(self, **overrides: Any) -> Settings:
        known = {f.name for f in fields(self)}
        unknown = set(overrides) - known
        if unknown:
            raise ValueError(f"unknown settings: {sorted(unknown)}")
        return replace(self, **overrides)


DEFAULT_SETTINGS: Final = Settings()

# Safety steps --break switches off: certification's, and recovery's (docs/recovery.md):
# "fvw" rolls back above each replica's last known watermark instead of the FVW, "no-inf"
# ends no epoch on a healthy shard's stream, "takeover" skips a new leader's phase 1,
# "rejoin-vote" lets a restarted replica vote in phase 1 before it has caught up, "lease"
# lets a leader answer and serve reads without a lease (docs/recovery.md "Stale reads"),
# "stamps" lets a new leader's writers ignore the readers its predecessor validated.
BREAKABLE_STEPS: Final = (
    "validation", "locking", "fvw", "no-inf", "takeover", "rejoin-vote", "lease", "stamps",
    "fsync",  # the simulated disk acknowledges syncs at once (store.sim.disk)
    "own-vote",  # a leader counts its own vote before its record is synced
)


@dataclass(frozen=True, slots=True)
class StreamSettings:
    """Every limit and timing of a stream, named (STYLE.md: put a limit on everything)."""

    # Records per entry; an open batch closes when it holds this many (Mako uses 400).
    batch_size_max: int = 400
    # An open batch closes this long after the previous one closed, full or not (on a stream
    # quiet that long, at the end of the step that opened it). Each entry costs a round of
    # messages to every region (grpc.aio: about 150 us of CPU per message, both ends), so at
    # a thousand records a second a 1 ms delay would send a thousand nearly empty entries.
    # 10 ms rather than 5: on geo3 under bench/peers' load, 15% less CPU per transaction and
    # 15% more certified throughput (2026-12-03). 20 ms rather than 10: certified throughput
    # 6,313 / 6,511 / 6,857 against 5,026 / 5,744 / 5,639 txn/s in three alternating pairs,
    # the certified answer's p50 9.5 ms against 11.4 and the pipelined commit's p50 the
    # same (67.5 ms: the longer wait is paid back in less CPU queueing); 30 and 40 ms gained
    # nothing more (6,536 / 6,881 and 6,618 / 6,320). Clients waiting for commit are not
    # held by it (batch_delay_awaited_ns), and a quiet stream's first record does not wait
    # (2026-12-05).
    batch_delay_ns: int = 20 * MS
    # While a client waits for the COMMITTED answer of a transaction this leader coordinates
    # (not one that went on at certification), the open batch closes at the first multiple
    # of this after the previous one closed instead (StreamLeader.hurry): its commit waits
    # for the batch, and the multiples make every leader on the same clock close such
    # batches together (+2.5% committed throughput on geo3, 2026-12-05). On
    # geo3 at 50 ms with every client waiting for commit: +0.5 to +4% committed throughput
    # (RMW mean -1 to -2.5 ms) in three alternating pairs, -1.5 and -1.9% in two pairs in a
    # slow spell of the machine (the batch wait saved went to CPU queueing); every batch at
    # 2 ms cost more in CPU queueing (read-only mean 1.9 -> 3.6 ms) than it saved
    # (2026-12-04). A participant shard hurries too (InstallRequest.hurry, SoloRequest's): its batch
    # holding the same transaction's writes waited its own 20 ms delay whenever none of its
    # own clients waited (geo3, 8 clients waiting for commit: read-modify-write mean 60.3 ->
    # 54.7 ms, p99 74.4 -> 60.4, 2026-12-05).
    batch_delay_awaited_ns: int = 5 * MS
    # An idle stream proposes an empty entry this long after its last proposal when the
    # entry would carry news (a watermark or vector watermark above the last entry's). No
    # commit waits for it (a quiet stream's records go at once, a fellow worker's wait is
    # heartbeat_wanted_interval_ns'); a follower sees the last writes before a quiet spell
    # up to this late. 25 ms rather than 10: on geo3 at 50 ms with one transaction in flight
    # per leader, 13% less CPU with one worker (71.8% -> 62.3% of the machine) and 10-14%
    # less with two (158-160% -> 136-143%), RMW p50 the same or lower (2026-12-03).
    heartbeat_interval_ns: int = 25 * MS
    # An idle stream proposes an empty entry this long after its last proposal when it
    # would carry nothing new: it only keeps the followers' and the leader lease's evidence
    # fresh (keep it below leader_lease_ns less a round trip). At 100 heartbeats a second,
    # idle streams cost a server process about a tenth of a core in gRPC messages alone.
    heartbeat_idle_interval_ns: int = 100 * MS
    # An idle stream of a worker proposes its risen claim this soon after its last proposal
    # when a fellow worker waits for it (``StreamLeader.want``): a transaction of the fellow
    # commits once every stream of its shard carries a stamp at or above its counter. With
    # heartbeat_interval_ns alone, two workers at one transaction in flight each committed
    # in a median 57-62 ms against 52.5 for one shard (simulator, 50 ms round trips).
    heartbeat_wanted_interval_ns: int = 1 * MS
    # Slots proposed and not yet chosen, at most (the pipeline depth).
    slots_in_flight_max: int = 64
    # Records appended and not yet in a proposed slot; ``StreamLeader.can_append`` says no
    # past it, so the replica stops certifying instead of buffering without bound.
    pending_records_max: int = 100_000
    # Retransmission of Accept (phase 2a) and Prepare (phase 1a) to silent acceptors. Above
    # the widest inter-region round trip.
    accept_retry_ns: int = 250 * MS
    prepare_retry_ns: int = 250 * MS
    # A commit index that moved and rode on no Accept is announced this long after. As long
    # as batch_delay_ns, so that on a busy stream the next Accept carries it: a Commit of its
    # own is a gRPC message to every follower (about 150 us of CPU at both ends) for news
    # only followers' snapshot reads use, which now lag up to this much more. 10 ms rather
    # than 1: on geo3 at 50 ms, five alternating pairs gave 1.7-8.3% more committed and
    # 7-36% more certified throughput, read-only means 0.7-1.4 ms lower (2026-12-04); 20
    # with the 20 ms batches (10 and 20 measured alike in two pairs, 2026-12-05).
    commit_announce_delay_ns: int = 20 * MS
    # A learner asks the leader for chosen slots it is missing once the gap is this old,
    # and again at this interval.
    fetch_retry_ns: int = 100 * MS
    # Fetch requests (of fetch_entries_max slots each) a catching-up learner keeps on the wire.
    fetches_in_flight_max: int = 4
    # Entries per Promise (phase 1b) and per Chosen reply; longer answers come in pieces.
    promise_entries_max: int = 1024
    fetch_entries_max: int = 256
    # Proposals a learner holds ahead of its delivery point; later ones are fetched.
    learner_window_slots: int = 4096
    # Chosen slots a replica keeps (in its acceptor, and in the leader's log for lagging
    # learners) below its newest chosen slot; older ones are forgotten (memory bound). A
    # follower further behind than this copies a live replica's state instead.
    log_retained_slots: int = 10_000

    def __post_init__(self) -> None:
        for f in fields(self):
            assert getattr(self, f.name) > 0, f"{f.name} must be positive"

    def with_overrides(self, **overrides: Any) -> StreamSettings:
        known = {f.name for f in fields(self)}
        unknown = set(overrides) - known
        if unknown:
            raise ValueError(f"unknown stream settings: {sorted(unknown)}")
        return replace(self, **overrides)


DEFAULT_STREAM_SETTINGS: Final = StreamSettings()
