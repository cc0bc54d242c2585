"""atheris fuzz target for the RPC packet parser and protocol core (native/mr_core.c).

Each input is decoded into a few datagrams, some raw bytes and some with a well-formed header
and fuzzed fields, fed to a server core holding a live session and to a client core with
requests in flight; requests that complete are answered and the cores' own packets are
exchanged, so the fuzzer reaches deep protocol states. A crash, a sanitizer report or an
exception is a finding.

Coverage feedback comes from this Python harness only: libFuzzer-style coverage of the C code
needs clang's -fsanitize=fuzzer-no-link, and the project's machines have gcc. The structured
input (well-formed headers with fuzzed fields, small session numbers) is what gets the
mutations past the magic check into the protocol logic.

Briefly, as the test suite runs it:
    python tests/rpc/fuzz_rpc_packet.py -max_total_time=3
Longer, keeping a corpus (see docs/rpc.md; build with MERIDIAN_SANITIZE=1 for ASan/UBSan):
    mkdir -p /tmp/rpc-corpus && python tests/rpc/fuzz_rpc_packet.py -max_total_time=600 /tmp/rpc-corpus
"""

from __future__ import annotations

import struct
import sys

import atheris

with atheris.instrument_imports():
    from store.rpc._native import MAGIC_DATA, MAGIC_SM, SM_BODY_BYTES, Core

CLIENT = b"client"
SERVER = b"server"
SETTINGS = {"mtu_bytes": 256, "msg_size_max": 64 * 1024, "session_req_window": 4,
            "session_credits": 8, "sessions_max": 8, "rto_ns": 1000}


@atheris.instrument_func
def pump(server: Core, client: Core, now: int, answer: bytes) -> None:
    """Exchange the cores' own packets and answer every request, a bounded number of times."""
    for _ in range(4):
        for addr, pkt in client.take_packets():
            if addr == SERVER:
                server.feed(CLIENT, pkt, now)
        for event in server.take_events():
            if event[0] == 0:
                server.respond(event[1], event[5], event[2], 0, answer, now)
        for addr, pkt in server.take_packets():
            if addr == CLIENT:
                client.feed(SERVER, pkt, now)
        client.take_events()


def fresh_pair() -> tuple[Core, Core]:
    server, client = Core(seed=1, **SETTINGS), Core(seed=2, **SETTINGS)
    session = client.create_session(SERVER, 0)
    pump(server, client, 0, b"")
    client.enqueue_request(session, 1, bytes(700), 1, 0)  # a multi-packet request in flight
    client.enqueue_request(session, 2, b"x", 2, 0)
    return server, client


@atheris.instrument_func
def packet(fdp: atheris.FuzzedDataProvider, tags: list[int]) -> bytes:
    if fdp.ConsumeBool():
        return fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 300))
    magic = MAGIC_SM if fdp.ConsumeIntInRange(0, 3) == 0 else MAGIC_DATA
    w0 = (
        fdp.ConsumeIntInRange(0, 255)
        | fdp.ConsumeIntInRange(0, 2000) << 8
        | fdp.ConsumeIntInRange(0, 3) << 32  # dest_session: small, so it hits real ones
        | fdp.ConsumeIntInRange(0, 3) << 48
        | fdp.ConsumeIntInRange(0, 12) << 50
    )
    # Mostly the tag of a live session, so that packets get past the session check.
    tag = tags[fdp.ConsumeIntInRange(0, len(tags) - 1)] if fdp.ConsumeIntInRange(0, 7) else 0
    w1 = fdp.ConsumeIntInRange(0, 64) | magic << 44 | tag << 48
    body_len = SM_BODY_BYTES if magic == MAGIC_SM and fdp.ConsumeBool() else fdp.ConsumeIntInRange(0, 260)
    return struct.pack("<QQ", w0, w1) + fdp.ConsumeBytes(body_len)


@atheris.instrument_func
def test_one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    server, client = fresh_pair()
    tags = [server.session_info(0)["local_tag"], client.session_info(0)["local_tag"]]
    now = 1
    for _ in range(fdp.ConsumeIntInRange(1, 8)):
        target = server if fdp.ConsumeBool() else client
        source = (CLIENT if target is server else SERVER) if fdp.ConsumeIntInRange(0, 4) else b"x"
        target.feed(source, packet(fdp, tags), now)
        now += fdp.ConsumeIntInRange(0, 5000)
        target.tick(now)
        pump(server, client, now, fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 600)))
    server.stats()
    client.stats()


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
