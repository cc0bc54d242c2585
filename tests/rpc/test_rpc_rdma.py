"""RDMA UD transport (DESIGN.md section 6). Needs pyverbs and an RDMA device; this project's
machines have neither a device nor an RDMA subsystem, so the traffic tests skip with the
reason. The address codec is tested everywhere."""

from __future__ import annotations

import pytest

from store.rpc import Nexus
from store.rpc.aio import Rpc
from store.rpc.rdma import (
    RdmaAddress,
    decode_address,
    encode_address,
    gid_bytes,
    gid_text,
    rdma_unavailable_reason,
)
from tests.rpc.helpers import echo_nexus, pattern, run


def test_address_codec_round_trips() -> None:
    address = RdmaAddress(bytes(range(16)), 0x123456, 7)
    raw = encode_address(address)
    assert len(raw) == 22
    assert decode_address(raw) == address
    assert gid_bytes(gid_text(address.gid)) == address.gid
    with pytest.raises(ValueError):
        encode_address((b"short", 1, 2))


def test_rpc_over_rdma_ud() -> None:
    reason = rdma_unavailable_reason()
    if reason is not None:
        pytest.skip(f"RDMA unavailable: {reason}")
    from store.rpc.rdma import RdmaUdTransport

    async def main() -> None:
        server = Rpc(echo_nexus(reverse=True), RdmaUdTransport())
        client = Rpc(Nexus(), RdmaUdTransport())
        session = await client.connect(server.transport.address)  # type: ignore[attr-defined]
        for size in (0, 32, 5000, 1 << 20):
            payload = pattern(size)
            assert await client.call(session, 1, payload) == payload[::-1]
        client.close()
        server.close()

    run(main)
