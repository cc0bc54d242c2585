"""``python -m store.wan`` as its own process, driven by the control protocol from this one
(the way a nemesis drives it), with links grouped by region pair."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from store.wan import ControlError, parse_address, send
from store.wan.cli import build_parser, load
from tests.conftest import REPO
from tests.wan.helpers import connect, round_trip_s, server

START_LINES_MAX = 20
DELAY_MS = 10


@contextmanager
def proxy_process(*links: str) -> Iterator[tuple[dict[str, str], str]]:
    argv = [sys.executable, "-m", "store.wan", "--delay-ms", str(DELAY_MS), "--jitter-ms", "1"]
    argv += ["--control", "127.0.0.1:0"]
    for link in links:
        argv += ["--link", link]
    process = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    addresses: dict[str, str] = {}
    control = ""
    try:
        for _ in range(START_LINES_MAX):
            line = process.stdout.readline()
            assert line, "wan-proxy exited before it was ready"
            if match := re.match(r"wan-proxy link (\S+) (\S+) > ", line):
                addresses[match[1]] = match[2]
            if match := re.match(r"wan-proxy ready control=(\S+)", line):
                control = match[1]
                break
        assert control
        yield addresses, control
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0


def _is_reset(address: str) -> bool:
    parsed = parse_address(address)
    try:
        with connect(parsed) as sock:
            sock.sendall(b"?")
            return not sock.recv(1)
    except ConnectionError:
        return True


def test_nemesis_partitions_a_region_from_another_process() -> None:
    with server("echo") as target:
        links = [f"{name}=127.0.0.1:0>{target}" for name in ("us-eu", "us-ap", "eu-ap")]
        with proxy_process(*links) as (addresses, control):
            assert send(control, {"op": "ping"}) == {"ok": True}
            with connect(parse_address(addresses["us-ap"])) as survivor:
                assert round_trip_s(survivor) >= 2 * (DELAY_MS - 1) / 1000

                reply = send(control, {"op": "partition", "region": "eu", "mode": "drop"})
                assert reply["links"] == ["us-eu", "eu-ap"]
                assert _is_reset(addresses["us-eu"]) and _is_reset(addresses["eu-ap"])
                round_trip_s(survivor)  # us-ap is untouched

                status = {s["name"]: s for s in send(control, {"op": "status"})["links"]}
                assert status["us-eu"]["partition"] == "drop"
                assert status["us-ap"]["partition"] is None
                assert status["eu-ap"]["regions"] == ["ap", "eu"]

                send(control, {"op": "heal", "link": "*"})
                with connect(parse_address(addresses["us-eu"])) as back:
                    round_trip_s(back)

                send(control, {"op": "set_delay", "between": ["ap", "us"], "delay_ms": 40})
                assert round_trip_s(survivor) >= 2 * (40 - 1) / 1000


def test_bad_control_input_gets_an_error_line_and_changes_nothing() -> None:
    with server("echo") as target, proxy_process(f"us-eu=127.0.0.1:0>{target}") as (_, control):
        before = send(control, {"op": "status"})
        with pytest.raises(ControlError, match="no link matches"):
            send(control, {"op": "partition", "link": "us-mars", "mode": "drop"})
        with pytest.raises(ControlError, match="'mode'"):
            send(control, {"op": "partition", "link": "us-eu", "mode": "maybe"})
        host, port = control.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            reader = sock.makefile("rb")
            for bad in [b"{not json\n", b"[1, 2]\n", b'{"op": "ping"}\n']:
                sock.sendall(bad)
                replies = json.loads(reader.readline())
                assert replies["ok"] is (bad == b'{"op": "ping"}\n'), replies
                if not replies["ok"]:
                    assert replies["error"]
        assert send(control, {"op": "status"}) == before


def test_config_file(tmp_path: Path) -> None:
    config = tmp_path / "wan.toml"
    config.write_text(
        'delay_ms = 25\njitter_ms = 1\ncontrol = "127.0.0.1:7900"\n'
        '[[links]]\nname = "us-eu"\nlisten = "127.0.0.1:17001"\ntarget = "127.0.0.2:7001"\n'
        '[[links]]\nname = "frankfurt"\nlisten = "127.0.0.1:17002"\ntarget = "127.0.0.2:7002"\n'
        'delay_ms = 40\nfrom = "us"\nto = "eu"\n'
    )
    args = build_parser().parse_args(["--config", str(config), "--jitter-ms", "2"])
    links, settings = load(args)
    assert [(s.name, s.delay_ms, s.jitter_ms, s.regions) for s in links] == [
        ("us-eu", 25, 2, {"us", "eu"}),
        ("frankfurt", 40, 2, {"us", "eu"}),
    ]
    assert settings["control"] == "127.0.0.1:7900"


def test_command_line_errors_exit_2() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "store.wan", "--link", "us-eu=nowhere"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2 and "NAME=LISTEN>TARGET" in result.stderr
