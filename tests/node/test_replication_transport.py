"""The gRPC transport of the Paxos streams (store/node/replication.py, DESIGN.md §4:
"Streams run over gRPC bidirectional streams between regions, never one RPC per
transaction"). Real transports on loopback, in one uvloop loop; the wide-area test goes
through a real ``store.wan.ProxyThread``."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, TypeVar

import grpc
import grpc.aio

from store.core.paxos import (
    DEFAULT_STREAM_SETTINGS,
    Accept,
    Accepted,
    Ballot,
    Commit,
    Entry,
    EntryKind,
    Fetch,
    PaxosMessage,
    StreamFollower,
    StreamLeader,
)
from store.core.vclock import VectorClock
from store.node.replication import ReplicationTransport
from store.proto import replication_pb2 as pb
from store.proto.convert import to_batch
from store.wan import Address, LinkSpec, ProxyThread
from tests.paxos_samples import B1
from tests.paxos_samples import sample_messages as all_messages

try:
    from store.rpc.aio import new_event_loop
except ImportError:  # the C extension is being rebuilt: the transport needs none of it
    from store.wan.thread import new_event_loop

T = TypeVar("T")
HOST = "127.0.0.1"
WAIT_S = 10.0  # a bound on every wait, never an expectation
POLL_S = 0.005


def run(main: Callable[[asyncio.AbstractEventLoop], Awaitable[T]]) -> T:
    loop = new_event_loop()
    try:
        return loop.run_until_complete(main(loop))
    finally:
        loop.close()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


def batch_entry(first_counter: int, records: int) -> Entry:
    """A batch of ``records`` certified-transaction-like records."""
    counters = list(range(first_counter, first_counter + records))
    return Entry(
        EntryKind.BATCH,
        [{"id": c, "writes": [[f"k{c}", b"v" * 16]], "vc": {"0": c}} for c in counters],
        counters,
        first_counter,
        vw=VectorClock({0: first_counter, 1: 3}),
    )


def sample_messages(stream: int) -> list[PaxosMessage]:
    """One of each message, with real entries."""
    return all_messages(stream, batch_entry(10, 5))


class Node:
    """A transport and what it received."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        address: str,
        port: int,
        routes: dict[str, tuple[str, int]],
        **options: Any,
    ) -> None:
        self.received: list[tuple[str, PaxosMessage]] = []
        self.received_at: list[float] = []
        self.transport = ReplicationTransport(
            address, (HOST, port), routes, self._on_message, loop=loop, **options
        )

    def _on_message(self, src: str, message: PaxosMessage) -> None:
        self.received.append((src, message))
        self.received_at.append(time.monotonic())


async def us_with_eu_down(loop: asyncio.AbstractEventLoop, **us_options: Any) -> tuple[Node, Node]:
    """"us" started, sending to "eu", which is made but not started (down)."""
    us_port, eu_port = free_port(), free_port()
    us = Node(loop, "us", us_port, {"eu": (HOST, eu_port)}, **us_options)
    eu = Node(loop, "eu", eu_port, {"us": (HOST, us_port)})
    await us.transport.start()
    return us, eu


async def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(POLL_S)


async def until_sent(transport: ReplicationTransport, messages: int) -> None:
    """Wait until ``transport`` counts ``messages`` sent: a write completes on the sender a
    little after (or before) the receiver has the batch, so counters lag deliveries."""
    await wait_for(lambda: transport.stats()["messages_sent"] == messages, f"{messages} sent")


async def cluster(
    loop: asyncio.AbstractEventLoop, names: list[str], **options: Any
) -> dict[str, Node]:
    ports = {name: free_port() for name in names}
    nodes = {
        name: Node(
            loop,
            name,
            ports[name],
            {peer: (HOST, ports[peer]) for peer in names if peer != name},
            **options,
        )
        for name in names
    }
    for node in nodes.values():
        await node.transport.start()
    return nodes


async def close_all(nodes: dict[str, Node]) -> None:
    for node in nodes.values():
        await node.transport.close()


def test_three_regions_exchange_every_message_in_order_and_intact() -> None:
    async def main(loop: asyncio.AbstractEventLoop) -> None:
        nodes = await cluster(loop, ["us", "eu", "ap"])
        try:
            sent: dict[tuple[str, str], list[PaxosMessage]] = {}
            for src in nodes:
                for dst in nodes:
                    if src != dst:
                        # stream numbers tell the pairs apart in what arrives
                        messages = sample_messages(stream=len(sent))
                        sent[(src, dst)] = messages
                        for message in messages:
                            nodes[src].transport.send(dst, message)
            total = sum(len(m) for m in sent.values())
            await wait_for(
                lambda: sum(len(n.received) for n in nodes.values()) == total, "every message"
            )
            for (src, dst), messages in sent.items():
                got = [m for s, m in nodes[dst].received if s == src]
                assert got == messages, (src, dst)
            for node in nodes.values():
                await until_sent(node.transport, 2 * len(sample_messages(0)))
                stats = node.transport.stats()
                assert stats["dropped"] == 0 and stats["bad_batches"] == 0
                assert (
                    stats["messages_sent"]
                    == stats["messages_received"]
                    == 2 * len(sample_messages(0))
                )
        finally:
            await close_all(nodes)

    run(main)


class RoleDriver:
    """Adapts one pure Paxos role to a transport and loop timers, as store/node will."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, role: Any, transport: ReplicationTransport
    ) -> None:
        self.loop = loop
        self.role = role
        self.transport = transport
        self.chosen: list[tuple[int, Entry]] = []
        self.timer: asyncio.TimerHandle | None = None

    def handle(self, src: str, message: PaxosMessage) -> None:
        self.role.handle(time.monotonic_ns(), src, message)
        self.flush()

    def tick(self) -> None:
        self.timer = None
        self.role.tick(time.monotonic_ns())
        self.flush()

    def flush(self) -> None:
        ready = self.role.ready()
        for dst, message in ready.messages:
            self.transport.send(dst, message)
        self.chosen.extend(ready.chosen)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if ready.wake_at is not None:
            delay_s = max(0.0, (ready.wake_at - time.monotonic_ns()) / 1e9)
            self.timer = self.loop.call_later(delay_s, self.tick)


def test_a_paxos_stream_runs_over_the_transport() -> None:
    # DESIGN.md §4: a leader's entries are chosen by a majority of regions and delivered, in
    # slot order, to every follower region, with the messages carried by this transport.
    records_total = 3000

    async def main(loop: asyncio.AbstractEventLoop) -> None:
        names = ["us", "eu", "ap"]
        ports = {name: free_port() for name in names}
        drivers: dict[str, RoleDriver] = {}

        def deliver_to(name: str) -> Callable[[str, PaxosMessage], None]:
            # drivers[name] is built after the transports: look it up on each delivery.
            def deliver(src: str, message: PaxosMessage) -> None:
                drivers[name].handle(src, message)

            return deliver

        transports = {
            name: ReplicationTransport(
                name,
                (HOST, ports[name]),
                {peer: (HOST, ports[peer]) for peer in names if peer != name},
                deliver_to(name),
                loop=loop,
            )
            for name in names
        }
        leader = StreamLeader(
            0,
            "us",
            ["eu", "ap"],
            Ballot(1, "us"),
            DEFAULT_STREAM_SETTINGS,
            now_ns=time.monotonic_ns(),
            counters_in_order=True,
        )
        drivers["us"] = RoleDriver(loop, leader, transports["us"])
        for name in ("eu", "ap"):
            drivers[name] = RoleDriver(
                loop, StreamFollower(0, DEFAULT_STREAM_SETTINGS), transports[name]
            )
        for transport in transports.values():
            await transport.start()
        try:
            drivers["us"].flush()  # phase 1
            for counter in range(1, records_total + 1):
                while not leader.can_append():
                    await asyncio.sleep(POLL_S)
                leader.append(time.monotonic_ns(), {"txn": counter}, counter)
                drivers["us"].flush()
                if counter % 50 == 0:
                    await asyncio.sleep(0)

            def records(name: str) -> list[Any]:
                return [r for _, entry in drivers[name].chosen for r in entry.records]

            def has_all_records(name: str) -> bool:
                return len(records(name)) >= records_total

            expected = [{"txn": counter} for counter in range(1, records_total + 1)]
            for name in names:
                await wait_for(partial(has_all_records, name), name)
                assert records(name) == expected, name
                slots = [slot for slot, _ in drivers[name].chosen]
                assert slots == list(range(slots[0], slots[0] + len(slots))), name
            stats = transports["us"].stats()
            assert stats["bad_batches"] == 0
            print(f"\nPaxos stream, {records_total} records, us sent: {stats}")
        finally:
            for driver in drivers.values():
                if driver.timer is not None:
                    driver.timer.cancel()
            for transport in transports.values():
                await transport.close()

    run(main)


def test_close_with_a_peer_down_does_not_wait_for_it() -> None:
    async def main(loop: asyncio.AbstractEventLoop) -> None:
        us = Node(loop, "us", 0, {"eu": (HOST, free_port())})
        await us.transport.start()
        for slot in range(1000):
            us.transport.send("eu", Accepted(0, B1, slot))
        await asyncio.sleep(0.05)
        await asyncio.wait_for(us.transport.close(), WAIT_S)
        us.transport.send("eu", Accepted(0, B1, 0))  # after close: dropped, no error
        assert us.transport.stats()["messages_sent"] == 0

    run(main)


def test_sends_of_one_loop_iteration_go_out_as_one_write() -> None:
    # The point of batches (issue 5 item 2): 1000 Paxos messages are not 1000 gRPC writes.
    async def main(loop: asyncio.AbstractEventLoop) -> None:
        nodes = await cluster(loop, ["us", "eu"])
        us, eu = nodes["us"], nodes["eu"]
        try:
            us.transport.send("eu", Commit(0, B1, 0))  # open the stream first
            await wait_for(lambda: len(eu.received) == 1, "the first message")
            await until_sent(us.transport, 1)
            before_sent = us.transport.stats()["batches_sent"]
            before_received = eu.transport.stats()["batches_received"]
            for slot in range(1000):
                us.transport.send("eu", Accepted(0, B1, slot))
            await wait_for(lambda: len(eu.received) == 1001, "1000 messages")
            await until_sent(us.transport, 1001)
            assert [m.slot for _, m in eu.received[1:]] == list(range(1000))  # type: ignore[attr-defined]
            batches_sent = us.transport.stats()["batches_sent"] - before_sent
            batches_received = eu.transport.stats()["batches_received"] - before_received
            assert batches_sent == batches_received
            assert 1 <= batches_sent <= 3, batches_sent
        finally:
            await close_all(nodes)

    run(main)


def test_batches_are_cut_at_the_message_and_byte_limits() -> None:
    async def main(loop: asyncio.AbstractEventLoop) -> None:
        # 64 KiB writes: an Accept of 400 records (~20 KiB) fits, four of them do not.
        nodes = await cluster(
            loop, ["us", "eu"], batch_messages_max=100, message_bytes_max=64 * 1024
        )
        us, eu = nodes["us"], nodes["eu"]
        try:
            for slot in range(1000):
                us.transport.send("eu", Accepted(0, B1, slot))
            await wait_for(lambda: len(eu.received) == 1000, "1000 small messages")
            await until_sent(us.transport, 1000)
            assert us.transport.stats()["batches_sent"] == 10
            big = [Accept(0, B1, slot, batch_entry(400 * slot + 1, 400), slot) for slot in range(8)]
            for message in big:
                us.transport.send("eu", message)
            await wait_for(lambda: len(eu.received) == 1008, "8 large Accepts")
            await until_sent(us.transport, 1008)
            assert [m for _, m in eu.received[1000:]] == big
            assert us.transport.stats()["batches_sent"] >= 10 + 3
            assert us.transport.stats()["dropped"] == 0
        finally:
            await close_all(nodes)

    run(main)


def test_a_peer_that_comes_up_late_or_restarts_receives_what_is_sent_after() -> None:
    async def main(loop: asyncio.AbstractEventLoop) -> None:
        us, eu = await us_with_eu_down(loop, connect_backoff_s=0.02, connect_backoff_max_s=0.2)
        eu_port = eu.transport.listen[1]
        us_port = us.transport.listen[1]
        try:
            # eu is down: sending neither blocks nor fails.
            for slot in range(5):
                us.transport.send("eu", Accepted(0, B1, slot))
            await asyncio.sleep(0.1)
            await eu.transport.start()
            after = [Accepted(1, B1, slot) for slot in range(100)]
            for message in after:
                us.transport.send("eu", message)
            await wait_for(
                lambda: [m for _, m in eu.received if m.stream == 1] == after,
                "messages sent after eu came up",
            )

            # eu restarts: a new process on the same port. Paxos would retransmit, so do the
            # same with a probe until one arrives, then everything sent after must arrive.
            await eu.transport.close()
            eu = Node(loop, "eu", eu_port, {"us": (HOST, us_port)})
            await eu.transport.start()
            deadline = time.monotonic() + WAIT_S
            probe = 0
            while not eu.received:
                assert time.monotonic() < deadline, "eu never heard from us again"
                us.transport.send("eu", Commit(2, B1, probe))
                probe += 1
                await asyncio.sleep(0.02)
            after = [Accepted(3, B1, slot) for slot in range(100)]
            for message in after:
                us.transport.send("eu", message)
            await wait_for(
                lambda: [m for _, m in eu.received if m.stream == 3] == after,
                "messages sent after eu restarted",
            )
            assert us.transport.stats()["reconnects"] >= 1
        finally:
            await us.transport.close()
            await eu.transport.close()

    run(main)


def test_queue_is_bounded_and_drops_the_oldest_while_a_peer_is_down() -> None:
    async def main(loop: asyncio.AbstractEventLoop) -> None:
        us, eu = await us_with_eu_down(loop, queue_messages_max=50)
        try:
            for slot in range(10):
                us.transport.send("eu", Accepted(0, B1, slot))
            await asyncio.sleep(0.05)  # the writer takes these into a write that waits
            for slot in range(10, 210):
                us.transport.send("eu", Accepted(0, B1, slot))
            assert us.transport.stats()["dropped"] == 150
            await eu.transport.start()
            await wait_for(lambda: len(eu.received) == 60, "what was kept")
            slots = [m.slot for _, m in eu.received]  # type: ignore[attr-defined]
            assert slots == list(range(10)) + list(range(160, 210))
        finally:
            await us.transport.close()
            await eu.transport.close()

    run(main)


def test_messages_that_waited_past_the_age_limit_are_dropped_not_sent() -> None:
    """A backlog of retransmissions for a peer that was down is not sent when it returns
    (Paxos has sent them again meanwhile): only what is younger than queue_age_max_s."""

    async def main(loop: asyncio.AbstractEventLoop) -> None:
        us, eu = await us_with_eu_down(loop, queue_age_max_s=0.2)
        try:
            first = Accepted(0, B1, 0)
            us.transport.send("eu", first)
            # The writer takes it into a write that waits for eu; what follows queues.
            await wait_for(lambda: us.transport.queued()["eu"] == 0, "the first taken")
            for slot in range(1, 21):
                us.transport.send("eu", Accepted(0, B1, slot))
            await asyncio.sleep(0.3)  # the time that makes them stale, not a synchronisation
            await eu.transport.start()
            await wait_for(lambda: len(eu.received) == 1, "the first, once eu is up")
            fresh = [Accepted(1, B1, slot) for slot in range(5)]
            for message in fresh:
                us.transport.send("eu", message)
            await wait_for(lambda: len(eu.received) == 6, "the fresh ones")
            assert [m for _, m in eu.received] == [first, *fresh]
            assert us.transport.stats()["dropped"] == 20
        finally:
            await us.transport.close()
            await eu.transport.close()

    run(main)


def test_a_backlog_goes_out_in_writes_of_the_byte_target() -> None:
    """Each write converts at most batch_bytes_target of messages (the event loop's work
    between two awaits), however much is queued and however large a write may be."""

    async def main(loop: asyncio.AbstractEventLoop) -> None:
        nodes = await cluster(loop, ["us", "eu"], batch_bytes_target=48 * 1024)
        us, eu = nodes["us"], nodes["eu"]
        try:
            # ~20 KiB each: two per write.
            big = [Accept(0, B1, slot, batch_entry(400 * slot + 1, 400), slot) for slot in range(8)]
            for message in big:
                us.transport.send("eu", message)
            await wait_for(lambda: len(eu.received) == 8, "8 large Accepts")
            await until_sent(us.transport, 8)
            assert [m for _, m in eu.received] == big
            assert us.transport.stats()["batches_sent"] == 4
            assert us.transport.stats()["dropped"] == 0
        finally:
            await close_all(nodes)

    run(main)


def test_a_malformed_batch_is_counted_and_the_stream_goes_on() -> None:
    # DESIGN.md §1: no input from another region can crash a server.
    async def main(loop: asyncio.AbstractEventLoop) -> None:
        nodes = await cluster(loop, ["us", "eu"])
        us, eu = nodes["us"], nodes["eu"]
        try:
            assert eu.transport.port is not None
            async with grpc.aio.insecure_channel(f"{HOST}:{eu.transport.port}") as channel:
                call = channel.stream_stream("/meridian.replication.v1.Replication/Replicate")()
                await call.write(b"\xff\xff\xff not protobuf")
                wrong_kind = pb.ReplicationBatch(src="raw")
                wrong_kind.messages.add().accept.entry.kind = 7
                await call.write(wrong_kind.SerializeToString())
                good = [Accepted(5, B1, 1), Commit(5, B1, 2)]
                await call.write(to_batch("raw", good).SerializeToString())
                await wait_for(lambda: len(eu.received) == 2, "the good batch")
                assert eu.received == [("raw", m) for m in good]
                assert not call.done()
                await call.done_writing()
                assert await call.code() == grpc.StatusCode.OK
            stats = eu.transport.stats()
            assert stats["bad_batches"] == 2
            assert stats["batches_received"] == 1
            us.transport.send("eu", Fetch(5, 0, 1))
            await wait_for(lambda: len(eu.received) == 3, "a regular message afterwards")
            assert eu.received[-1] == ("us", Fetch(5, 0, 1))
        finally:
            await close_all(nodes)

    run(main)


def test_through_the_wan_proxy_a_message_takes_at_least_the_one_way_delay() -> None:
    delay_ms = 25.0

    async def main(loop: asyncio.AbstractEventLoop) -> None:
        eu = Node(loop, "eu", 0, {})
        await eu.transport.start()
        assert eu.transport.port is not None
        link = LinkSpec("us-eu", Address(HOST, 0), Address(HOST, eu.transport.port), delay_ms)
        with ProxyThread([link]) as proxy:
            via = proxy.address("us-eu")
            # routes[dst] is the proxy listener, not eu itself.
            us = Node(loop, "us", 0, {"eu": (via.host, via.port)})
            await us.transport.start()
            try:
                us.transport.send("eu", Commit(0, B1, 0))  # connect (HTTP/2 setup is delayed too)
                await wait_for(lambda: len(eu.received) == 1, "the first message")
                latencies = []

                def received(count: int) -> bool:
                    return len(eu.received) == count

                for index in range(1, 6):
                    sent_at = time.monotonic()
                    us.transport.send("eu", Commit(0, B1, index))
                    await wait_for(partial(received, index + 1), "a delayed message")
                    latencies.append(eu.received_at[-1] - sent_at)
                print(
                    f"\nwan-proxy {delay_ms:g} ms one way: latency ms "
                    f"{[round(s * 1000, 1) for s in latencies]}"
                )
                assert min(latencies) >= delay_ms / 1000
            finally:
                await us.transport.close()
                await eu.transport.close()

    run(main)


def test_a_dropped_wan_link_heals_and_the_stream_is_redialled() -> None:
    # docs/wan.md "Partitions": drop resets every connection of the link; after heal, gRPC
    # must come back by itself (the transport redials) and carry what is sent from then on.
    async def main(loop: asyncio.AbstractEventLoop) -> None:
        eu = Node(loop, "eu", 0, {})
        await eu.transport.start()
        assert eu.transport.port is not None
        link = LinkSpec("us-eu", Address(HOST, 0), Address(HOST, eu.transport.port), 2.0)
        with ProxyThread([link]) as proxy:
            via = proxy.address("us-eu")
            us = Node(
                loop,
                "us",
                0,
                {"eu": (via.host, via.port)},
                connect_backoff_s=0.02,
                connect_backoff_max_s=0.2,
            )
            await us.transport.start()
            try:
                us.transport.send("eu", Commit(0, B1, 0))
                await wait_for(lambda: len(eu.received) == 1, "the first message")
                await asyncio.to_thread(proxy.partition, "us-eu", mode="drop")
                for slot in range(20):  # lost or queued: either is allowed
                    us.transport.send("eu", Accepted(1, B1, slot))
                    await asyncio.sleep(0.005)
                await asyncio.to_thread(proxy.heal, "us-eu")
                deadline = time.monotonic() + WAIT_S
                probe = 0
                while not any(m.stream == 2 for _, m in eu.received):
                    assert time.monotonic() < deadline, "the link never came back"
                    us.transport.send("eu", Commit(2, B1, probe))
                    probe += 1
                    await asyncio.sleep(0.02)
                after = [Accepted(3, B1, slot) for slot in range(100)]
                for message in after:
                    us.transport.send("eu", message)
                await wait_for(
                    lambda: [m for _, m in eu.received if m.stream == 3] == after,
                    "messages sent after the heal",
                )
                assert us.transport.stats()["reconnects"] >= 1
            finally:
                await us.transport.close()
                await eu.transport.close()

    run(main)


def test_throughput_of_one_stream_is_reported() -> None:
    # A figure for the record (printed with -s), not asserted: STYLE.md "a test never fails
    # on an absolute time".
    async def main(loop: asyncio.AbstractEventLoop) -> None:
        nodes = await cluster(loop, ["us", "eu"])
        us, eu = nodes["us"], nodes["eu"]
        try:
            us.transport.send("eu", Commit(0, B1, 0))
            await wait_for(lambda: len(eu.received) == 1, "the first message")
            await until_sent(us.transport, 1)

            async def measure(label: str, messages: list[PaxosMessage], chunk: int) -> None:
                before = us.transport.stats()
                expected = len(eu.received) + len(messages)
                started = time.monotonic()
                for index in range(0, len(messages), chunk):
                    for message in messages[index : index + chunk]:
                        us.transport.send("eu", message)
                    await asyncio.sleep(0)  # a Paxos role sends from many loop callbacks
                await wait_for(lambda: len(eu.received) == expected, label)
                elapsed = time.monotonic() - started
                await until_sent(us.transport, before["messages_sent"] + len(messages))
                batches = us.transport.stats()["batches_sent"] - before["batches_sent"]
                print(
                    f"\n{label}: {len(messages) / elapsed:,.0f} messages/s, "
                    f"{batches / elapsed:,.0f} batches/s ({batches} batches, "
                    f"{len(messages) / batches:.0f} messages each, {elapsed:.2f} s)"
                )

            await measure(
                "Accepted, sent 100 per loop iteration",
                [Accepted(0, B1, slot) for slot in range(100_000)],
                100,
            )
            await measure(
                "Accepted, sent 1 per loop iteration",
                [Accepted(0, B1, slot) for slot in range(20_000)],
                1,
            )
            entry = batch_entry(1, 400)
            await measure(
                "Accept of a 400-record entry, 4 per loop iteration",
                [Accept(0, B1, slot, entry, slot) for slot in range(400)],
                4,
            )
        finally:
            await close_all(nodes)

    run(main)


def _server_process_grpc_setting(env: dict[str, str]) -> str | None:
    """The GRPC_EXPERIMENTS a fresh process that imports what a server imports
    (``store.node.server``) had when grpc's core (``grpc._cython.cygrpc``) was loaded."""
    import os
    import subprocess
    import sys

    probe = (
        "import os, sys\n"
        "class Spy:\n"
        "    seen = []\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'grpc._cython.cygrpc' and not Spy.seen:\n"
        "            Spy.seen.append(os.environ.get('GRPC_EXPERIMENTS'))\n"
        "        return None\n"
        "sys.meta_path.insert(0, Spy())\n"
        "import store.node.server\n"
        "assert Spy.seen, 'grpc was not imported'\n"
        "print(Spy.seen[0])\n"
    )
    environment = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"} | env
    out = subprocess.run(
        [sys.executable, "-c", probe], env=environment, capture_output=True, text=True,
        check=True, timeout=60,
    ).stdout.strip()
    return out


def test_a_server_process_loads_grpc_with_its_older_listener() -> None:
    # The EventEngine listener costs a received message four thread wakeups here (~140 us
    # of CPU against ~75); grpc reads the setting when its core is loaded, so the server
    # package (store/node/__init__.py) sets it before any of its modules imports grpc.
    assert _server_process_grpc_setting({}) == "-event_engine_listener"
    # An operator's own setting is kept.
    assert _server_process_grpc_setting({"GRPC_EXPERIMENTS": "-event_engine_client"}) == (
        "-event_engine_client"
    )
