"""Table tests for the pure parts: the delay line and the command parser."""

from __future__ import annotations

import random

import pytest

from store.wan import DelayLine, InvalidCommand, InvalidLink, parse_command, parse_link
from store.wan.delay import EOF

MS = 1_000_000


def drain(line: DelayLine, now_ns: int) -> list[bytes | None]:
    out = []
    while line.is_due(now_ns):
        out.append(line.pop())
    return out


def test_release_is_arrival_plus_delay() -> None:
    line = DelayLine(random.Random(0))
    line.push(b"a", 0, 25 * MS, 0)
    line.push(b"b", 10 * MS, 25 * MS, 0)
    assert line.next_release_at_ns() == 25 * MS
    assert drain(line, 25 * MS - 1) == []
    assert drain(line, 25 * MS) == [b"a"]
    assert drain(line, 35 * MS) == [b"b"]


def test_jitter_never_reorders() -> None:
    line = DelayLine(random.Random(7))
    for i in range(2000):
        line.push(str(i).encode(), i * 1000, 5 * MS, 4 * MS)  # arrivals far closer than jitter
    releases = [item.release_at_ns for item in line._queue]
    assert releases == sorted(releases)
    assert drain(line, 10**12) == [str(i).encode() for i in range(2000)]


def test_lowering_delay_keeps_order() -> None:
    line = DelayLine(random.Random(0))
    line.push(b"slow", 0, 50 * MS, 0)
    line.push(b"fast", 1 * MS, 0, 0)
    assert drain(line, 2 * MS) == []
    assert drain(line, 50 * MS) == [b"slow", b"fast"]


def test_jitter_is_seeded() -> None:
    def stamps(seed: int) -> list[int]:
        line = DelayLine(random.Random(seed))
        for i in range(50):
            line.push(b"x", i * MS * 10, 20 * MS, 3 * MS)
        return [item.release_at_ns for item in line._queue]

    assert stamps(1) == stamps(1)
    assert stamps(1) != stamps(2)


def test_hold_then_release_retimes_from_heal() -> None:
    line = DelayLine(random.Random(0))
    line.push(b"a", 0, 10 * MS, 0)
    line.hold()
    line.push(b"b", 5 * MS, 10 * MS, 0)
    line.push(EOF, 6 * MS, 10 * MS, 0)
    assert drain(line, 10**9) == []
    assert line.queued_bytes == 2
    line.release(100 * MS, 10 * MS, 0)
    assert drain(line, 109 * MS) == []
    assert drain(line, 110 * MS) == [b"a", b"b", EOF]
    assert line.queued_bytes == 0


def test_clear_discards() -> None:
    line = DelayLine(random.Random(0))
    line.push(b"abc", 0, 0, 0)
    line.clear()
    assert line.queued_bytes == 0 and len(line) == 0 and drain(line, 10**9) == []


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        ("partition", "JSON object"),
        ({}, "unknown op"),
        ({"op": "explode"}, "unknown op"),
        ({"op": "partition", "link": "us-eu"}, "'mode'"),
        ({"op": "partition", "link": "us-eu", "mode": "slow"}, "'mode'"),
        ({"op": "partition", "mode": "drop"}, "say which links"),
        ({"op": "heal", "link": "a", "region": "b"}, "one of"),
        ({"op": "heal", "link": ""}, "non-empty"),
        ({"op": "heal", "between": ["eu", "eu"]}, "two different"),
        ({"op": "heal", "link": "x", "colour": "red"}, "unknown field"),
        ({"op": "set_delay", "link": "x"}, "delay_ms"),
        ({"op": "set_delay", "link": "x", "delay_ms": -1}, "between 0"),
        ({"op": "set_delay", "link": "x", "delay_ms": "25"}, "number"),
        ({"op": "set_delay", "link": "x", "delay_ms": True}, "number"),
    ],
)
def test_bad_commands_are_named(raw: object, error: str) -> None:
    with pytest.raises(InvalidCommand, match=error):
        parse_command(raw)


def test_selectors() -> None:
    links = [
        ("us-eu", frozenset({"us", "eu"})),
        ("eu-ap/1", frozenset({"eu", "ap"})),
        ("us-ap", frozenset({"us", "ap"})),
    ]
    assert parse_command({"op": "heal", "region": "eu"}).select(links) == ["us-eu", "eu-ap/1"]
    assert parse_command({"op": "heal", "between": ["ap", "us"]}).select(links) == ["us-ap"]
    assert parse_command({"op": "heal", "link": "us-*"}).select(links) == ["us-eu", "us-ap"]
    with pytest.raises(InvalidCommand, match="no link matches"):
        parse_command({"op": "heal", "region": "mars"}).select(links)


def test_link_syntax() -> None:
    spec = parse_link("us-eu/0=127.0.0.1:17001>127.0.0.2:7001", 25, 1)
    assert (spec.name, str(spec.listen), str(spec.target)) == (
        "us-eu/0",
        "127.0.0.1:17001",
        "127.0.0.2:7001",
    )
    assert spec.regions == {"us", "eu"} and spec.delay_ms == 25 and spec.jitter_ms == 1
    for bad in ["us-eu", "x=127.0.0.1:1", "x=127.0.0.1>127.0.0.2:1", "x=1:99999>1:1", "=a:1>b:1"]:
        with pytest.raises(InvalidLink):
            parse_link(bad)
