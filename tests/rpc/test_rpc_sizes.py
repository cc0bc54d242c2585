"""Messages of every size from 0 bytes to msg_size_max (8 MiB) round-trip intact, in both
directions, split into MTU packets with credit returns and request-for-response packets
(DESIGN.md section 6)."""

from __future__ import annotations

import pytest

from store.rpc import HandlerFailed, MessageTooLarge, Nexus, RpcSettings
from store.rpc.aio import Rpc
from tests.rpc.helpers import echo_nexus, pattern, run, sim_pair

MIB = 1 << 20
PAYLOAD = RpcSettings().mtu_bytes - 16
SIZES = [0, 1, 15, 16, 17, PAYLOAD - 1, PAYLOAD, PAYLOAD + 1, 2 * PAYLOAD, 3 * PAYLOAD + 7,
         65_536, 1 * MIB + 3, 8 * MIB]


@pytest.mark.parametrize("size", SIZES)
def test_sim_round_trip_intact(size: int) -> None:
    net, _server, client = sim_pair(seed=size, server_nexus=echo_nexus(reverse=True))
    session = client.create_session("server")
    payload = pattern(size)
    pending = client.enqueue_request(session, 1, payload)
    assert net.run_until(pending.done)
    assert pending.result() == payload[::-1]


def test_udp_round_trip_intact_all_sizes() -> None:
    async def main() -> None:
        server = Rpc.udp(echo_nexus(reverse=True))
        client = Rpc.udp(Nexus())
        session = await client.connect(server.address)
        for size in [*SIZES, 8 * MIB]:
            payload = pattern(size, salt=1)
            assert await client.call(session, 1, payload) == payload[::-1], size
        client.close()
        server.close()

    run(main)


def test_too_large_is_refused_at_enqueue_and_at_respond() -> None:
    nexus = Nexus()
    nexus.register_req_func(2, lambda _h, _p: bytes(8 * MIB + 1))
    net, _server, client = sim_pair(seed=3, server_nexus=nexus)
    session = client.create_session("server")
    with pytest.raises(MessageTooLarge):
        client.enqueue_request(session, 2, bytes(8 * MIB + 1))
    # A handler answering too much: the client learns it as a handler failure.
    pending = client.enqueue_request(session, 2, b"")
    assert net.run_until(pending.done)
    with pytest.raises(HandlerFailed, match="MessageTooLarge"):
        pending.result()
