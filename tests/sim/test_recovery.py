"""Leaders that die, in the simulator (docs/recovery.md; issue 10's "Done when", simulator part).

Shard replicas are crashed during the load (all their memory lost) and restarted; the
configuration manager replaces a crashed leader with a follower, which takes its stream
over; every shard ends the epoch, the finalized vector watermark is assembled, what is above
it is rolled back; a restarted replica copies a live one's state and rejoins. Checked
on every seed: the history, every oracle, no transaction a client heard COMMITTED rolled
back (``lost-committed``), everything that depended on a rolled-back transaction rolled back
too, one live leader per shard and every replica in the final epoch with its FVW applied,
and followers equal to their leaders.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from store.cli import main
from store.sim.run import SimOptions, run_many
from tests.sim.seeds import caught

# The options of the 1000-seed runs (`meridian sim --regions 3 --shards 3 --loss 0.05
# --partitions --crashes --duration-ms 2000`) that found the seeds replayed below.
SEED_RUN = SimOptions(
    loss=0.05, regions=3, shards=3, partitions=True, crashes=True, duration_ms=2000,
    scan_fraction=0.15, snapshot_fraction=0.1,
)


@pytest.mark.parametrize("workload", ["list-append", "bank"])
def test_crashed_leaders_are_replaced_and_nothing_committed_is_lost(workload: str, capsys) -> None:
    code = main([
        "sim", "--seeds", "100", "--regions", "3", "--shards", "3", "--loss", "0.05",
        "--crashes", "--duration-ms", "1000", "--workload", workload, "--json",
    ])
    summary = json.loads(capsys.readouterr().out)
    assert code == 0
    assert summary["anomalies"] == 0, summary.get("first_failure")
    assert summary["lost_committed"] == 0
    assert summary["seeds_with_failover"] >= 80
    assert summary["crashes"] >= 100
    assert summary["restarts"] >= 50
    assert summary["transactions_committed"] > 1000


def test_crashes_and_partitions_together() -> None:
    """A partitioned leader is replaced too (it is alive: it must step down when it hears
    of the new epoch), and a crash may come on top."""
    seeds = list(range(32))  # 16 were enough to reach a rollback until 2026-12-04's drift
    summary = run_many(
        seeds, SimOptions(loss=0.05, regions=3, partitions=True, crashes=True, duration_ms=1000),
    )
    assert summary["anomalies"] == 0, summary.get("first_failure")
    # Every seed's first crash is a leader's; partitions depose leaders too.
    assert summary["failovers"] > len(seeds)
    assert summary["rolled_back"] > 0


@pytest.mark.parametrize(
    ("step", "seeds", "caught_by"),
    [
        # Rolling back above each replica's last known watermark, not the FVW, undoes
        # committed transactions and leaves replicas disagreeing.
        ("fvw", list(range(12)), {"lost-committed", "follower-diverged", "rollback-incomplete"}),
        # Without INF a healthy shard never ends the epoch: no FVW, no end to recovery.
        ("no-inf", list(range(12)), {"recovery-unfinished", "follower-diverged"}),
        # Without phase 1 a new leader overwrites what a majority had accepted. It needs a
        # crash with slots in flight, which idle streams (heartbeats 100 ms apart) seldom
        # have: 4 of seeds 0-39 showed it (2026-12-01, after idle heartbeats went from 10 ms);
        # seed 18 on 2026-12-03, seed 1 on 2026-12-04 (commits riding on Accepts),
        # seed 2 with 20 ms batches (2026-12-05), seed 0 with hurried batches on the clock's
        # ticks, seed 7 once participants hurried too (clean unbroken), seed 0 again once
        # busy servers said "held" unasked and RPC timeouts adapted (2026-12-06).
        ("takeover", [0], {"lost-committed", "follower-diverged",
                                        "invariant-broken", "recovery-unfinished", "G1a",
                                        "snapshot-mismatch", "rollback-incomplete"}),
    ],
)
def test_each_recovery_step_broken_is_caught(
    step: str, seeds: list[int], caught_by: set[str]
) -> None:
    options = SimOptions(loss=0.05, regions=3, crashes=True, duration_ms=1000, break_step=step)
    caught(options, seeds, caught_by)


def test_a_restarted_replica_that_votes_before_it_has_caught_up_loses_a_commit() -> None:
    """The scripted schedule ``rejoin-behind`` (store/sim/run.py): a leader crashes after
    slots were chosen with one follower's vote only; it restarts and copies the state of
    the other follower, which had not learned them, and that follower becomes leader while
    the one holding them is cut off. Had the restarted replica answered the new leader's
    phase 1 at once, the two would form a majority without the slots and lose committed
    transactions. It waits until it has caught up with the current leader (Acceptor,
    restarted). A script, not a found seed: seeds 142, 34, 20 and 165 of the random crash
    runs each stopped showing it when a change moved the schedules."""
    scenario = SimOptions(
        loss=0.05, regions=3, shards=3, scenario="rejoin-behind", duration_ms=6000,
    )
    summary = run_many([0, 1], scenario)
    assert summary["failovers"] >= 4 and summary["anomalies"] == 0, summary.get("first_failure")
    broken = run_many([0, 1], replace(scenario, break_step="rejoin-vote"))
    assert "lost-committed" in broken["seeds_with_anomalies"], broken["seeds_with_anomalies"]
    assert broken["lost_committed"] == 2


def test_seed_499_of_the_first_crash_run_stays_clean() -> None:
    """Seed 499 of the first 1000-seed run found that a shard whose new leader (epoch 1)
    hears of epoch 3 without having seen epoch 2 must end epoch 2 too (its INF had ended
    only its own epoch, so epoch 2's FVW never completed). Since the crash nemesis also
    restarts replicas, this seed no longer has that schedule (one failover now); it is
    kept as a clean crash seed, and the 1000-seed runs are what cover skipped epochs."""
    summary = run_many([499], SEED_RUN)
    assert summary["failovers"] >= 1
    assert summary["anomalies"] == 0, summary.get("first_failure")


def test_a_new_leaders_writers_dominate_the_readers_its_predecessor_validated() -> None:
    """Seed 287 (found by the 1000-seed list-append run of 2026-12-01): a transaction of
    epoch 0 validated a read of 'la/000001' at shard 0's leader, which stamped its clock on
    the key, and then crashed. The new leader rebuilt its store by replay, which carries no
    stamps, so an epoch-2 writer of that key missed the reader's shard-2 entry and became
    durable before it (dependency-closure). A new leader's writers now dominate the base of
    its epoch on every shard until the vector watermark passes it (rule 9).

    Since issue 12's short path changed the schedules, seed 287 no longer meets that case
    without the rule (nor did seeds 280-450 and 1000-1025 of a search): it stays here as a
    clean failover seed, and tests/core/test_recovery_core.py checks rule 9, and that
    ``--break stamps`` removes it, on a promoted leader directly."""
    summary = run_many([287], SEED_RUN)
    assert summary["failovers"] >= 1 and summary["anomalies"] == 0, summary.get("first_failure")
