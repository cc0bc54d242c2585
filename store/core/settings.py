"""Every limit and timing of the core, named (STYLE.md: put a limit on everything)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

MS = 1_000_000  # nanoseconds per millisecond


@dataclass(frozen=True, slots=True)
class Settings:
    key_bytes_max: int = 1024
    value_bytes_max: int = 1 << 20
    request_bytes_max: int = 4 << 20
    ops_per_txn_max: int = 1024
    reads_per_txn_max: int = 10_000
    scan_limit_max: int = 10_000
    procedure_args_max: int = 64
    # Transactions a coordinator runs at once; past it new submissions get UNAVAILABLE.
    txns_in_flight_max: int = 4096
    # Speculation (DESIGN.md §3, Mako): certified writes are visible at once. Off, a
    # participant keeps its locks and hides new versions until the transaction is committed,
    # and the client hears nothing before commit (the "OCC+OR" baseline of the ablation).
    speculation: bool = True
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
    # Outcomes remembered for client retries (exactly-once) and finished txns per participant.
    outcomes_remembered_max: int = 100_000
    finished_txns_remembered_max: int = 100_000

    def with_overrides(self, **overrides: Any) -> Settings:
        known = {f.name for f in fields(self)}
        unknown = set(overrides) - known
        if unknown:
            raise ValueError(f"unknown settings: {sorted(unknown)}")
        return replace(self, **overrides)


DEFAULT_SETTINGS = Settings()

# Safety steps --break switches off: certification's, and recovery's (docs/recovery.md):
# "fvw" rolls back above each replica's last known watermark instead of the FVW, "no-inf"
# ends no epoch on a healthy shard's stream, "takeover" skips a new leader's phase 1,
# "rejoin-vote" lets a restarted replica vote in phase 1 before it has caught up, "lease"
# lets a leader answer and serve reads without a lease (docs/recovery.md "Stale reads"),
# "stamps" lets a new leader's writers ignore the readers its predecessor validated.
BREAKABLE_STEPS = (
    "validation", "locking", "fvw", "no-inf", "takeover", "rejoin-vote", "lease", "stamps",
)

