"""No input from the network crashes an endpoint: truncated, oversized, wrong-magic and random
packets are dropped and counted (DESIGN.md section 1, "Bad input")."""

from __future__ import annotations

import random
import socket
import struct

from store.rpc import Nexus, RpcSettings
from store.rpc._native import MAGIC_BUNDLE, MAGIC_DATA, MAGIC_SM, Core, encode_header
from store.rpc.aio import Rpc
from tests.rpc.helpers import echo_nexus, run, sim_pair

CLIENT = b"client"


def _connected_server() -> tuple[Core, Core]:
    """A server core with one session from CLIENT, set up by a real client core."""
    server, client = Core(seed=1), Core(seed=2)
    client.create_session(b"server", 0)
    for _ in range(3):
        for _addr, pkt in client.take_packets():
            server.feed(CLIENT, pkt, 1)
        for _addr, pkt in server.take_packets():
            client.feed(b"server", pkt, 1)
    assert client.session_info(0)["state"] == "connected"
    return server, client


def test_each_kind_of_bad_packet_is_counted() -> None:
    server, _client = _connected_server()
    mtu = server.settings["mtu_bytes"]
    before = server.stats()
    for n in range(16):
        server.feed(CLIENT, bytes(n), 2)  # truncated: shorter than a header
    server.feed(CLIENT, bytes(mtu + 1), 2)  # oversized
    tag = server.session_info(0)["local_tag"]
    bad_magic = bytearray(encode_header(1, 0, 0, 0, 0, 1, session_tag=tag))
    bad_magic[13] ^= 0xF0  # the magic nibble: 11 becomes 4
    server.feed(CLIENT, bytes(bad_magic), 2)
    # Well-formed header, inconsistent body: msg_size says 10, the packet carries 3.
    server.feed(CLIENT, encode_header(1, 10, 0, 0, 0, 9, session_tag=tag) + b"abc", 2)
    # A session management packet of the wrong length.
    server.feed(CLIENT, encode_header(1, 0, 0xFFFF, 0, 0, 0, MAGIC_SM) + b"x", 2)
    # A request for a session that does not exist.
    server.feed(CLIENT, encode_header(1, 0, 77, 0, 0, 9), 2)
    # From an address that does not own session 0.
    server.feed(b"intruder", encode_header(1, 0, 0, 0, 0, 9, session_tag=tag), 2)
    # Session 0 from the right address, but with another session's tag (a delayed packet of
    # an earlier session with the same number).
    server.feed(CLIENT, encode_header(1, 0, 0, 0, 0, 9, session_tag=tag ^ 1), 2)
    after = server.stats()
    assert after["rx_short"] - before["rx_short"] == 16
    assert after["rx_oversized"] - before["rx_oversized"] == 1
    assert after["rx_bad_magic"] - before["rx_bad_magic"] == 1
    assert after["rx_malformed"] - before["rx_malformed"] == 2
    assert after["rx_unknown_session"] - before["rx_unknown_session"] == 3
    assert server.take_events() == []  # no handler ran


def test_random_packets_never_crash_and_service_continues() -> None:
    rng = random.Random(2024)
    server, client = _connected_server()
    valid = encode_header(1, 5, 0, 0, 0, 8, session_tag=server.session_info(0)["local_tag"])
    for i in range(20_000):
        kind = i % 4
        if kind == 0:
            pkt = rng.randbytes(rng.randrange(0, 2000))
        elif kind == 1:  # random header fields with the right magic
            w0 = rng.getrandbits(64)
            w1 = (rng.getrandbits(44) | (rng.choice([MAGIC_DATA, MAGIC_SM]) << 44)
                  | rng.getrandbits(16) << 48)
            pkt = struct.pack("<QQ", w0, w1) + rng.randbytes(rng.randrange(0, 64))
        elif kind == 2:  # bit flips of a valid packet
            b = bytearray(valid + b"hello")
            for _ in range(rng.randrange(1, 4)):
                b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
            pkt = bytes(b)
        else:  # truncations of a valid packet
            pkt = (valid + b"hello")[: rng.randrange(0, 21)]
        server.feed(CLIENT if rng.random() < 0.7 else rng.randbytes(rng.randrange(1, 33)), pkt, i)
        server.tick(i)
        for ev in server.take_events():
            if ev[0] == 0:
                server.respond(ev[1], ev[5], ev[2], 0, b"ok", i)
        server.take_packets()
    stats = server.stats()
    dropped = sum(stats[k] for k in ("rx_short", "rx_oversized", "rx_bad_magic", "rx_malformed",
                                      "rx_unknown_session", "rx_stale", "rx_out_of_order"))
    assert dropped > 10_000
    # A real client still gets service. (On a fresh session: a forged packet from the
    # client's own address may legitimately have advanced the old session's slots.)
    fresh = client.create_session(b"server", 10**6)
    assert client.enqueue_request(fresh, 1, b"still there", 42, 10**6) == 0
    for _ in range(4):
        for _addr, pkt in client.take_packets():
            server.feed(CLIENT, pkt, 10**6)
        for ev in server.take_events():
            if ev[0] == 0:
                server.respond(ev[1], ev[5], ev[2], 0, ev[4].upper(), 10**6)
        for _addr, pkt in server.take_packets():
            client.feed(b"server", pkt, 10**6)
    assert (1, 42, 0, b"STILL THERE") in client.take_events()


def test_sim_endpoint_survives_garbage_datagrams() -> None:
    net, server, client = sim_pair(seed=6)
    rng = random.Random(6)
    for _ in range(2000):
        net.send("client", "server", rng.randbytes(rng.randrange(0, 200)))
    session = client.create_session("server")
    pending = client.enqueue_request(session, 1, b"ping")
    assert net.run_until(pending.done)
    assert pending.result() == b"ping"
    stats = server.stats()
    dropped = sum(stats[k] for k in ("rx_short", "rx_bad_magic", "rx_malformed",
                                      "rx_unknown_session", "rx_stale", "rx_out_of_order"))
    assert dropped >= 2000


def test_udp_server_survives_garbage() -> None:
    async def main() -> None:
        server = Rpc.udp(echo_nexus(), settings=RpcSettings())
        junk = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        rng = random.Random(7)
        for n in [0, 1, 15, 16, 17, 100, 1472, 1473, 9000, 60000]:
            junk.sendto(rng.randbytes(n), server.address)
        junk.sendto(encode_header(1, 0, 0, 0, 0, 8), server.address)  # no such session
        client = Rpc.udp(Nexus())
        session = await client.connect(server.address)
        assert await client.call(session, 1, b"alive") == b"alive"
        stats = server.stats()
        assert stats["rx_oversized"] == 3  # 1473, 9000 and 60000 bytes
        assert stats["rx_short"] == 3  # 0, 1 and 15 bytes
        assert stats["rx_unknown_session"] >= 1
        junk.close()
        client.close()
        server.close()

    run(main)


def _bundle(*parts: bytes) -> bytes:
    """A bundle datagram's header (all zero but the magic's nibble) and ``parts`` as given."""
    header = bytearray(16)
    header[13] = MAGIC_BUNDLE << 4
    return bytes(header) + b"".join(parts)


def test_malformed_bundles_are_counted_and_the_server_goes_on() -> None:
    """A bundle whose lengths do not add up is counted (rx_bad_bundles) and its rest dropped,
    after the packets before the fault were taken one by one; a bundle inside a bundle is a
    bad magic; the server keeps serving."""

    async def main() -> None:
        server = Rpc.udp(echo_nexus(), settings=RpcSettings())
        junk = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        unknown = encode_header(1, 0, 0, 0, 0, 8)  # a packet for a session nobody has
        length = struct.Struct("<H")
        bad = [
            _bundle(),  # empty
            _bundle(b"\x01"),  # half a length
            _bundle(length.pack(15) + bytes(15)),  # shorter than a header
            _bundle(length.pack(200) + unknown),  # longer than what is left
            _bundle(length.pack(len(unknown)) + unknown, b"\x05"),  # a good packet, then junk
        ]
        for datagram in bad:
            junk.sendto(datagram, server.address)
        nested = _bundle(length.pack(len(unknown)) + unknown)
        junk.sendto(_bundle(length.pack(len(nested)) + nested), server.address)
        two = _bundle(*(length.pack(len(unknown)) + unknown for _ in range(2)))
        junk.sendto(two, server.address)
        client = Rpc.udp(Nexus())
        session = await client.connect(server.address)
        assert await client.call(session, 1, b"alive") == b"alive"
        stats = server.stats()
        assert stats["rx_bad_bundles"] == 5
        assert stats["rx_bad_magic"] == 1  # the nested bundle
        # The good packets of the fifth bundle and of the last one reached the core.
        assert stats["rx_unknown_session"] >= 3
        rng = random.Random(11)
        for _ in range(300):
            junk.sendto(_bundle(rng.randbytes(rng.randrange(0, 1400))), server.address)
        assert await client.call(session, 1, b"still") == b"still"
        junk.close()
        client.close()
        server.close()

    run(main)
