"""Mutual TLS on the replication links (issue 13; docs/security.md): a link is made only
between processes whose certificates the cluster's CA signed, are valid now, and name the
process dialed. A certificate from another CA, or one that has expired, is refused with a
clear log line, and nothing it carries is applied."""

from __future__ import annotations

import asyncio
import datetime
import logging
import time

import pytest

from store.core.paxos import Commit, PaxosMessage
from store.node.certs import Issued, make_ca, make_certificate
from store.node.replication import ReplicationTransport, TlsIdentity
from tests.node.test_replication_transport import B1, HOST, free_port, run

WAIT_S = 10.0
REFUSAL_WAIT_S = 3.0  # long enough for several dials; a refused link never delivers


def _identity(issued: Issued, ca: Issued) -> TlsIdentity:
    return TlsIdentity(issued.key_pem, issued.certificate_pem, ca.certificate_pem,
                       {"b": "shard-0-eu"})


def _deliveries(sender: TlsIdentity, receiver: TlsIdentity, wait_s: float) -> list[PaxosMessage]:
    """Sends one message from "a" to "b"; what "b" received within ``wait_s``."""

    async def main(loop: asyncio.AbstractEventLoop) -> list[PaxosMessage]:
        received: list[PaxosMessage] = []
        port = free_port()
        b = ReplicationTransport("b", (HOST, port), {}, lambda _src, m: received.append(m),
                                 loop=loop, tls=receiver)
        a = ReplicationTransport("a", (HOST, free_port()), {"b": (HOST, port)},
                                 lambda _src, _m: None, loop=loop, tls=sender,
                                 connect_backoff_s=0.05, connect_backoff_max_s=0.2)
        await b.start()
        await a.start()
        try:
            a.send("b", Commit(0, B1, 3))
            deadline = time.monotonic() + wait_s
            while not received and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
                if not received and a.stats()["dropped"]:
                    a.send("b", Commit(0, B1, 3))  # a refused write drops it: send again
            return received
        finally:
            await a.close()
            await b.close()

    return run(main)


@pytest.fixture(scope="module")
def ca() -> Issued:
    return make_ca("test", days=30)


def test_processes_of_one_ca_replicate(ca: Issued) -> None:
    a = make_certificate(ca, "shard-0", [HOST], days=30)
    b = make_certificate(ca, "shard-0-eu", [HOST], days=30)
    assert _deliveries(_identity(a, ca), _identity(b, ca), WAIT_S) == [Commit(0, B1, 3)]


@pytest.mark.parametrize("fault", ["wrong CA", "expired", "another process's name"])
def test_a_peer_the_cluster_ca_does_not_vouch_for_is_refused_and_nothing_applied(
    ca: Issued, fault: str, caplog: pytest.LogCaptureFixture,
) -> None:
    a = make_certificate(ca, "shard-0", [HOST], days=30)
    if fault == "wrong CA":
        other = make_ca("other", days=30)
        b = make_certificate(other, "shard-0-eu", [HOST], days=30)
        receiver = TlsIdentity(b.key_pem, b.certificate_pem, other.certificate_pem, {})
    elif fault == "expired":
        long_ago = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=10)
        b = make_certificate(ca, "shard-0-eu", [HOST], days=1, now=long_ago)
        receiver = _identity(b, ca)
    else:
        b = make_certificate(ca, "shard-1-eu", [HOST], days=30)  # valid, but not "b"'s
        receiver = _identity(b, ca)
    with caplog.at_level(logging.INFO, logger="store.node.replication"):
        received = _deliveries(_identity(a, ca), receiver, REFUSAL_WAIT_S)
    assert received == []  # nothing applied
    refusals = [r.getMessage() for r in caplog.records if "refused by TLS" in r.getMessage()]
    assert refusals, [r.getMessage() for r in caplog.records]
    assert "shard-0-eu" in refusals[0]  # says whom it expected


def test_a_sender_without_a_certificate_of_the_cluster_is_refused(ca: Issued) -> None:
    """The other direction: the receiver checks the dialing process's certificate too."""
    other = make_ca("other", days=30)
    a = make_certificate(other, "shard-0", [HOST], days=30)
    b = make_certificate(ca, "shard-0-eu", [HOST], days=30)
    # The sender trusts the receiver (it has the cluster's CA) but shows another CA's
    # certificate: the receiver refuses the handshake.
    sender = TlsIdentity(a.key_pem, a.certificate_pem, ca.certificate_pem, {"b": "shard-0-eu"})
    assert _deliveries(sender, _identity(b, ca), REFUSAL_WAIT_S) == []


def test_a_peer_that_comes_up_late_gets_what_was_queued_for_it(ca: Issued) -> None:
    """With TLS a write to a peer that is down fails at once: the sender waits for the link
    rather than taking queued messages into writes that fail (one per dial says why), so
    what is younger than the age limit arrives once the peer is up."""
    a_cert = make_certificate(ca, "shard-0", [HOST], days=30)
    b_cert = make_certificate(ca, "shard-0-eu", [HOST], days=30)

    async def main(loop: asyncio.AbstractEventLoop) -> tuple[list[PaxosMessage], int]:
        received: list[PaxosMessage] = []
        port = free_port()
        a = ReplicationTransport("a", (HOST, free_port()), {"b": (HOST, port)},
                                 lambda _src, _m: None, loop=loop, tls=_identity(a_cert, ca),
                                 connect_backoff_s=0.05, connect_backoff_max_s=0.2,
                                 queue_age_max_s=30.0)
        b = ReplicationTransport("b", (HOST, port), {}, lambda _src, m: received.append(m),
                                 loop=loop, tls=_identity(b_cert, ca))
        await a.start()
        try:
            sent = [Commit(0, B1, slot) for slot in range(100)]
            for message in sent:
                a.send("b", message)
            await asyncio.sleep(0.5)  # several dials fail meanwhile
            await b.start()
            deadline = time.monotonic() + WAIT_S
            while len(received) + a.stats()["dropped"] < len(sent):
                assert time.monotonic() < deadline, (len(received), a.stats())
                await asyncio.sleep(0.01)
            return received, a.stats()["dropped"]
        finally:
            await a.close()
            await b.close()

    received, dropped = run(main)
    # At most one message per failed dial (a few in half a second), the rest in order.
    assert dropped <= 8, dropped
    assert received == [Commit(0, B1, slot) for slot in range(dropped, 100)]
