"""An adversarial network chosen by Hypothesis: it picks, packet by packet, which datagram in
flight is delivered next, dropped or duplicated, and how far time jumps (eRPC NSDI '19
section 5: the protocol must tolerate loss and reordering; DESIGN.md section 6: at-most-once).
Then the network turns reliable and everything must finish: each request exactly one
correct response, each handler at most once. Hypothesis shrinks a failure to a short
schedule."""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store.rpc._native import Core

CLIENT, SERVER = b"client", b"server"
CORE_SETTINGS = {"mtu_bytes": 80, "msg_size_max": 4096, "session_credits": 4,
                 "session_req_window": 2, "rto_ns": 1_000_000, "sessions_max": 4,
                 "session_timeout_ns": 10**12, "rx_reassembly_bytes_max": 1 << 20}
SETTLE_STEPS_MAX = 20_000


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(0, 300), min_size=1, max_size=6),
    schedule=st.lists(
        st.tuples(st.sampled_from(["deliver", "drop", "duplicate", "wait"]),
                  st.integers(0, 10**6), st.integers(0, 3_000_000)),
        max_size=120,
    ),
)
def test_exactly_once_under_an_adversarial_schedule(
    sizes: list[int], schedule: list[tuple[str, int, int]]
) -> None:
    server, client = Core(seed=1, **CORE_SETTINGS), Core(seed=2, **CORE_SETTINGS)
    session = client.create_session(SERVER, 0)
    payloads = {tag: bytes([tag]) * (n + 1) for tag, n in enumerate(sizes)}  # distinct
    for tag, payload in payloads.items():
        assert client.enqueue_request(session, 1, payload, tag, 0) == 0
    in_flight: list[tuple[bytes, bytes]] = []  # (destination, datagram)
    runs: Counter[bytes] = Counter()
    answers: dict[int, list[bytes]] = {tag: [] for tag in payloads}
    now = 0

    def collect() -> None:
        for addr, pkt in client.take_packets():
            in_flight.append((addr, pkt))
        for ev in server.take_events():
            if ev[0] == 0:
                runs[ev[4]] += 1
                server.respond(ev[1], ev[5], ev[2], 0, ev[4][::-1], now)
        for addr, pkt in server.take_packets():
            in_flight.append((addr, pkt))
        for ev in client.take_events():
            assert ev[0] in (1, 3), ev  # responses and the session's connect, no failures
            if ev[0] == 1:
                answers[ev[1]].append(ev[3])

    def deliver(index: int) -> None:
        addr, pkt = in_flight.pop(index)
        if addr == SERVER:
            server.feed(CLIENT, pkt, now)
        else:
            client.feed(SERVER, pkt, now)

    collect()
    for action, pick, advance in schedule:
        now += advance
        if action == "wait" or not in_flight:
            client.tick(now)
            server.tick(now)
        elif action == "deliver":
            deliver(pick % len(in_flight))
        elif action == "drop":
            in_flight.pop(pick % len(in_flight))
        else:
            in_flight.append(in_flight[pick % len(in_flight)])
        collect()
    # The network heals: FIFO delivery, time moves on, retransmission finishes the job.
    for _ in range(SETTLE_STEPS_MAX):
        if all(answers.values()) and not in_flight:
            break
        if in_flight:
            deliver(0)
        else:
            now += CORE_SETTINGS["rto_ns"]
            client.tick(now)
            server.tick(now)
        collect()
    assert all(len(a) == 1 for a in answers.values()), answers
    for tag, payload in payloads.items():
        assert answers[tag] == [payload[::-1]]
    assert all(n == 1 for n in runs.values()), runs
    assert client.session_info(session)["in_flight_max"] <= CORE_SETTINGS["session_credits"]
