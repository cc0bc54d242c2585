"""The cluster secret (issue 13; docs/rpc.md "Authentication"): an RPC endpoint with a secret
makes sessions only with endpoints that have the same one. A peer without it, or with
another, is refused at once with a typed error, counted, and never served."""

from __future__ import annotations

import hashlib
import hmac

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from store.rpc import Nexus, ReqHandle, Unauthenticated, _native
from store.rpc.aio import Rpc
from tests.rpc.helpers import run

SECRET = b"s" * 32
OTHER = b"o" * 32


# RFC 4231, test cases 1, 2 and 6 (a key longer than the block).
@pytest.mark.parametrize(
    ("key", "message", "mac"),
    [
        (b"\x0b" * 20, b"Hi There",
         "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"),
        (b"Jefe", b"what do ya want for nothing?",
         "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"),
        (b"\xaa" * 131, b"Test Using Larger Than Block-Size Key - Hash Key First",
         "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"),
    ],
)
def test_the_cores_hmac_sha256_matches_rfc_4231(key: bytes, message: bytes, mac: str) -> None:
    assert _native.hmac_sha256(key, message).hex() == mac


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.binary(max_size=3000))
def test_the_cores_hmac_sha256_matches_pythons(key: bytes, message: bytes) -> None:
    assert _native.hmac_sha256(key, message) == hmac.new(key, message, hashlib.sha256).digest()


def _server(secret: bytes | None) -> tuple[Rpc, list[bytes]]:
    served: list[bytes] = []

    def handler(_handle: ReqHandle, payload: bytes) -> bytes:
        served.append(payload)
        return payload

    nexus = Nexus()
    nexus.register_req_func(1, handler)
    server = Rpc.udp(nexus)
    if secret is not None:
        server.set_secret(secret)
    return server, served


@pytest.mark.parametrize("client_secret", [None, OTHER], ids=["missing", "wrong"])
def test_a_peer_without_the_secret_is_refused_counted_and_never_served(
    client_secret: bytes | None,
) -> None:
    async def main() -> None:
        server, served = _server(SECRET)
        client = Rpc.udp(Nexus())
        if client_secret is not None:
            client.set_secret(client_secret)
        with pytest.raises(Unauthenticated, match="cluster secret"):
            await client.connect(server.address, timeout=2.0)
        assert served == []
        stats = server.stats()
        assert stats["sm_unauthenticated"] >= 1
        assert stats["requests_handled"] == 0
        client.close()
        server.close()

    run(main)


def test_endpoints_with_the_same_secret_connect_and_are_served() -> None:
    async def main() -> None:
        server, served = _server(SECRET)
        client = Rpc.udp(Nexus())
        client.set_secret(SECRET)
        session = await client.connect(server.address, timeout=2.0)
        assert await client.call(session, 1, b"hello") == b"hello"
        assert served == [b"hello"]
        assert server.stats()["sm_unauthenticated"] == 0
        client.close()
        server.close()

    run(main)


def test_a_secret_is_16_to_64_bytes() -> None:
    async def main() -> None:
        endpoint = Rpc.udp(Nexus())
        try:
            for bad in (b"short", b"x" * 65):
                with pytest.raises(ValueError, match="16 to 64 bytes"):
                    endpoint.set_secret(bad)
            endpoint.set_secret(b"")  # none
            endpoint.set_secret(b"k" * 16)
        finally:
            endpoint.close()

    run(main)
