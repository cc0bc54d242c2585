"""What commit costs beyond the wide-area round trip, on the simulator's virtual time (no
CPU cost: the protocol's own floor). Three regions at 50 ms, transactions one at a time:
a single-shard read-modify-write commits one round trip after it arrives, plus the
network's jitter; a two-shard one, plus the other shard's watermark reaching its
coordinator. DESIGN.md §4; docs/design.md "Replication and watermarks"."""

from __future__ import annotations

import statistics
from collections.abc import Callable

from store.client.protocol import ClientSettings
from store.core.partition import Partitioner, WorkerPartitioner
from store.core.txn import Procedures
from store.sim.client import SdkProcess
from store.sim.cluster import REGIONS, SimCluster
from store.sim.loop import Simulator
from store.sim.network import MS, Network

RTT_MS = 50.0


def _geo_cluster(workers: int, seed: int = 1) -> tuple[Simulator, SimCluster, Callable[[str], SdkProcess]]:
    """Two shards of ``workers`` workers in three regions at RTT_MS, and a maker of clients
    in the leaders' region."""
    sim = Simulator(seed)
    network = Network(sim)
    partitioner: Partitioner = Partitioner(2)
    if workers > 1:
        partitioner = WorkerPartitioner(partitioner, workers)
    cluster = SimCluster(
        sim, network, partitioner.shard_count, Procedures(), regions=REGIONS[:3],
        wan_rtt_ms=RTT_MS, partitioner=partitioner,
    )
    cluster.start()

    def client(name: str) -> SdkProcess:
        return SdkProcess(
            sim, network, name, REGIONS[0], cluster.leader_addresses, cluster.partitioner,
            ClientSettings(timeout_s=30), cluster.rpc_settings,
        )

    return sim, cluster, client


def _commit_latencies_ms(two_shards: bool, count: int = 30, workers: int = 1) -> list[float]:
    sim, cluster, make_client = _geo_cluster(workers)
    client = make_client("client/latency")
    keys = [f"t/{i}" for i in range(400)]
    home = [k for k in keys if cluster.partitioner.shard_of(k) == 0]
    other = [k for k in keys if cluster.partitioner.shard_of(k) == workers]  # shard 1's first
    sim.run_until(sim.now_ns + 500 * MS)  # phase 1 of every stream done
    latencies = []
    for i in range(count):
        second = other[i] if two_shards else home[i + count]
        ops = [["increment", home[i], 1], ["increment", second, 1]]
        done: list[object] = []
        started = sim.now_ns
        client.drive(client.protocol.run(0, "", [ops], False, False), lambda r, e, done=done: done.append(e))
        while not done:
            sim.run_until(sim.now_ns + MS // 10)
        assert done == [None]
        latencies.append((sim.now_ns - started) / MS)
        sim.run_until(sim.now_ns + 37 * MS)  # a quiet stream between transactions
    return latencies


def test_a_quiet_single_shard_commit_costs_a_round_trip_and_little_more() -> None:
    """Before entries left at the end of the step on a quiet stream, every record waited
    the whole batch delay: p50 57.1 ms, minimum 55.8 (2026-12-03)."""
    latencies = _commit_latencies_ms(two_shards=False)
    assert statistics.median(latencies) <= RTT_MS + 3, latencies
    assert max(latencies) <= RTT_MS + 5, latencies


def test_a_quiet_two_shard_commit_hears_the_other_shard_at_once() -> None:
    """The other shard's watermark is pushed when it rises; before, it waited for the next
    round of gossip: a third of these took 4-5 ms more (max 57.5 ms, 2026-12-03)."""
    latencies = _commit_latencies_ms(two_shards=True)
    assert statistics.median(latencies) <= RTT_MS + 4, latencies
    assert max(latencies) <= RTT_MS + 5.5, latencies


def test_a_quiet_commit_on_one_worker_of_two_costs_what_it_costs_on_a_shard_of_one() -> None:
    """It also waits for the other worker's claim to be chosen: the worker that drew pushes
    gossip at once, which wakes the idle fellow, whose stream then carries its risen claim.
    Without that push the fellow heard of it at its next timer: p50 62.5 ms, max 65.7
    (2026-12-03)."""
    latencies = _commit_latencies_ms(two_shards=False, workers=2)
    assert statistics.median(latencies) <= RTT_MS + 3.5, latencies
    assert max(latencies) <= RTT_MS + 5, latencies


def _busy_worker_latencies_ms(workers: int, count: int = 40, seed: int = 1) -> list[float]:
    """Two clients, each a transaction at a time without pause, on keys of shard 0: with two
    workers, one client's keys on each worker; with one, halves of the shard's keys."""
    sim, cluster, make_client = _geo_cluster(workers, seed)
    keys = [f"t/{i}" for i in range(2000)]
    if workers > 1:
        homes = [[k for k in keys if cluster.partitioner.shard_of(k) == unit] for unit in (0, 1)]
    else:
        mine = [k for k in keys if cluster.partitioner.shard_of(k) == 0]
        homes = [mine[::2], mine[1::2]]
    clients = [make_client(f"client/busy-{c}") for c in range(2)]
    sim.run_until(sim.now_ns + 500 * MS)  # phase 1 of every stream done
    latencies: list[float] = []
    finished = [0, 0]

    def start(c: int, i: int) -> None:
        ops = [["increment", homes[c][2 * i], 1], ["increment", homes[c][2 * i + 1], 1]]
        started = sim.now_ns

        def done(result: object, error: object) -> None:
            assert error is None, error
            latencies.append((sim.now_ns - started) / MS)
            finished[c] += 1
            if i + 1 < count:
                start(c, i + 1)

        clients[c].drive(clients[c].protocol.run(0, "", [ops], False, False), done)

    start(0, 0)
    start(1, 0)
    while min(finished) < count:
        sim.run_until(sim.now_ns + MS)
    return latencies


def test_busy_workers_of_one_shard_commit_as_fast_as_one_shard() -> None:
    """Each worker's transactions also wait for the other's stream to stamp their counters.
    A busy fellow had proposed recently, so its claim waited for its next heartbeat
    (heartbeat_interval_ns after its last proposal): p50 57.0-61.7 ms over seeds 1-3 against
    52.4-52.8 with one worker (2026-12-03). A fellow's gossip now asks for the stamp
    (``StreamLeader.want``)."""
    one = _busy_worker_latencies_ms(workers=1)
    two = _busy_worker_latencies_ms(workers=2)
    assert statistics.median(two) <= statistics.median(one) + 2.5, (statistics.median(one), two)
    assert max(two) <= RTT_MS + 6, two


def _latencies_beside_a_busy_shard_ms(ops_of: Callable[[list[str], list[str], int], list[list[object]]]) -> tuple[list[float], SimCluster]:
    """Commit latencies of transactions ``ops_of(home, other, i)`` led from shard 0 by a
    client that waits for each commit, one at a time, while shard 1 is kept busy by a
    client that goes on at certification (its batches close by the ordinary delay,
    batch_delay_ns, and none of its own clients waits for a commit)."""
    sim, cluster, make_client = _geo_cluster(workers=1)
    waiter, busy = make_client("client/waits"), make_client("client/busy")
    keys = [f"t/{i}" for i in range(2000)]
    home = [k for k in keys if cluster.partitioner.shard_of(k) == 0]
    other = [k for k in keys if cluster.partitioner.shard_of(k) == 1]
    sim.run_until(sim.now_ns + 500 * MS)  # phase 1 of every stream done
    stopped: list[bool] = []

    def keep_busy(i: int) -> None:
        if stopped:
            return
        ops = [["increment", other[500 + i % 400], 1]]

        def done(result: object, error: object) -> None:
            assert error is None, error
            sim.after(2 * MS, keep_busy, i + 1)  # about 500 a second, none waiting

        busy.drive(busy.protocol.run(1, "", [ops], True, False), done)

    keep_busy(0)
    sim.run_until(sim.now_ns + 100 * MS)
    latencies = []
    for i in range(20):
        finished: list[object] = []
        started = sim.now_ns
        waiter.drive(
            waiter.protocol.run(0, "", [ops_of(home, other, i)], False, False),
            lambda r, e, finished=finished: finished.append(e),
        )
        while not finished:
            sim.run_until(sim.now_ns + MS // 10)
        assert finished == [None]
        latencies.append((sim.now_ns - started) / MS)
        sim.run_until(sim.now_ns + 7 * MS)
    stopped.append(True)
    return latencies, cluster


def test_a_two_shard_commit_does_not_wait_for_the_other_shards_ordinary_batch() -> None:
    """Shard 1 is kept busy by a client that goes on at certification, so its batches close
    by the ordinary delay (batch_delay_ns, 20 ms after the previous one), and none of its
    own clients waits for a commit. The two-shard transactions of a client that waits, led
    from shard 0, have a record in shard 1's open batch too: the InstallRequest says the
    client waits, and that batch closes on the next tick of the shorter delay as shard 0's
    does. Before, shard 1's record waited for its ordinary batch: 4 of these 20 took 70.2-73.4
    ms (median 53.7); with it, at most 57.0 (2026-12-05)."""
    latencies, _ = _latencies_beside_a_busy_shard_ms(
        lambda home, other, i: [["increment", home[i], 1], ["increment", other[i], 1]]
    )
    assert statistics.median(latencies) <= RTT_MS + 6, latencies
    assert max(latencies) <= RTT_MS + 9, latencies


def test_a_commit_led_from_a_shard_without_its_keys_does_not_wait_for_their_ordinary_batch() -> None:
    """The same through the solo path (a list routed to shard 0 whose keys are all on
    shard 1: ``SoloRequest``, which says the client waits, as an InstallRequest does).
    Before: 5 of these 20 took 69.9-72.3 ms; with it, at most 57.6 (2026-12-05)."""
    latencies, cluster = _latencies_beside_a_busy_shard_ms(
        lambda home, other, i: [["increment", other[i], 1], ["increment", other[i + 20], 1]]
    )
    leader = cluster.current_leaders()[0]
    assert leader is not None and leader.coordinator.counters["solo"] >= 20
    assert max(latencies) <= RTT_MS + 9, latencies


def test_clients_going_on_at_certification_hurry_no_stream() -> None:
    """Their two-shard transactions' InstallRequests say no one waits: every batch of both
    streams keeps the ordinary delay (what keeps a pipelined load's batches large)."""
    sim, cluster, make_client = _geo_cluster(workers=1)
    client = make_client("client/pipelined")
    keys = [f"t/{i}" for i in range(400)]
    home = [k for k in keys if cluster.partitioner.shard_of(k) == 0]
    other = [k for k in keys if cluster.partitioner.shard_of(k) == 1]
    sim.run_until(sim.now_ns + 500 * MS)  # phase 1 of every stream done
    finished: list[object] = []
    for i in range(40):
        ops = [["increment", home[i], 1], ["increment", other[i], 1]]
        client.drive(client.protocol.run(0, "", [ops], True, False), lambda r, e: finished.append(e))
        sim.run_until(sim.now_ns + 2 * MS)
    while len(finished) < 40:
        sim.run_until(sim.now_ns + MS)
    assert finished == [None] * 40
    leaders = cluster.current_leaders()
    assert all(leader is not None and leader.stream is not None for leader in leaders)
    assert [leader.stream.hurried for leader in leaders if leader and leader.stream] == [0, 0]
    assert all(leader and leader.coordinator.counters["certified"] for leader in leaders[:1])
