"""Hosts for the Jepsen harness (jepsen.hosts): regions in network namespaces, real partitions.

What a user would notice: a server in one region is reachable from the other regions and from
the client host; across a cut a TCP connect hangs until its timeout (no error comes back, as on
a real network) and datagrams vanish, while the client still reaches every region; healing
restores everything; and nothing is left behind. The namespace tests need root and
`ip netns`; they skip otherwise. Servers and probes are small Python processes started on a
host with `hosts.command` / `hosts.client_command`; this process never changes namespace.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import pytest

from jepsen.hosts import HostsError, LoopbackHosts, NetnsHosts, make_hosts, sweep

REGIONS = ["eu", "us", "ap"]
CLIENT = "client"
# How long a probe's TCP connect may wait. Across a cut it must wait all of it: an immediate
# failure would mean an ICMP error came back, which a real partition never sends.
CONNECT_TIMEOUT_S = 1.0
# Bounds on waiting for a condition (a server's "ready" line, a datagram's arrival); reached
# only when the test is failing.
DEADLINE_S = 10.0
# A port nothing listens on: reaching it gets an immediate refusal, not reaching it a timeout.
CLOSED_PORT = 9

# A region's server: a TCP listener and a UDP socket. Each TCP connection is answered with
# every datagram payload received so far, one per line, and closed.
SERVER = r"""
import socket, sys
address = sys.argv[1]
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.bind((address, 0))
udp.setblocking(False)
tcp = socket.create_server((address, 0))
print("ready", tcp.getsockname()[1], udp.getsockname()[1], flush=True)
received = []
while True:
    connection, _ = tcp.accept()
    while True:
        try:
            received.append(udp.recv(2048).decode())
        except BlockingIOError:
            break
    with connection:
        connection.sendall("\n".join(received).encode())
"""

# Sends one datagram, then connects over TCP and reads the answer; prints what happened.
PROBE = r"""
import json, socket, sys, time
address, tcp_port, udp_port, payload = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
timeout_s = float(sys.argv[5])
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
    udp.sendto(payload.encode(), (address, udp_port))
started = time.monotonic()
try:
    with socket.create_connection((address, tcp_port), timeout=timeout_s) as connection:
        answer = connection.makefile().read()
    outcome, detail = "connected", answer.split()
except TimeoutError:
    outcome, detail = "timeout", []
except OSError as error:
    outcome, detail = "error", [error.strerror or str(error)]
print(json.dumps({"outcome": outcome, "waited_s": time.monotonic() - started, "detail": detail}))
"""


@dataclass(frozen=True)
class Server:
    address: str
    tcp_port: int
    udp_port: int


class Request(NamedTuple):
    """A probe: from host ``where``, send ``payload`` to the UDP port, then connect over TCP."""

    where: str
    address: str
    tcp_port: int
    udp_port: int
    payload: str


@dataclass(frozen=True)
class Probe:
    outcome: str  # "connected", "timeout" or "error"
    waited_s: float
    detail: list[str]  # connected: the datagrams the server has received; error: why


def _netns_unavailable() -> str:
    if os.geteuid() != 0:
        return "not root: network namespaces need CAP_SYS_ADMIN"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    result = subprocess.run(["ip", "netns", "list"], check=False, capture_output=True, text=True)
    if result.returncode != 0:
        return f"ip netns is unavailable: {result.stderr.strip()}"
    return ""


def _skip_without_netns() -> None:
    reason = _netns_unavailable()
    if reason:
        pytest.skip(reason)


def _namespaces() -> set[str]:
    listing = subprocess.run(["ip", "netns", "list"], check=True, capture_output=True, text=True)
    return {line.split(" ", 1)[0] for line in listing.stdout.splitlines()}


def _on(hosts: NetnsHosts, where: str, argv: list[str]) -> list[str]:
    return hosts.client_command(argv) if where == CLIENT else hosts.command(where, argv)


@pytest.fixture
def hosts() -> Iterator[NetnsHosts]:
    """Three regions and a client, each in its own namespace; all removed on the way out."""
    _skip_without_netns()
    made = NetnsHosts(REGIONS)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def server(hosts: NetnsHosts) -> Iterator[Server]:
    """The server of region eu, bound to eu's address."""
    address = hosts.address("eu")
    process = subprocess.Popen(
        hosts.command("eu", [sys.executable, "-c", SERVER, address]),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], DEADLINE_S)
        assert ready, f"the server did not start within {DEADLINE_S} s"
        word, tcp_port, udp_port = process.stdout.readline().split()
        assert word == "ready"
        yield Server(address, int(tcp_port), int(udp_port))
    finally:
        process.kill()
        process.wait(timeout=DEADLINE_S)


def _probe_all(hosts: NetnsHosts, requests: list[Request]) -> list[Probe]:
    """Run the probes at the same time; return what each saw."""
    processes = []
    try:
        for request in requests:
            argv = [sys.executable, "-c", PROBE, request.address, str(request.tcp_port)]
            argv += [str(request.udp_port), request.payload, str(CONNECT_TIMEOUT_S)]
            processes.append(
                subprocess.Popen(
                    _on(hosts, request.where, argv),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        probes = []
        for process in processes:
            stdout, stderr = process.communicate(timeout=DEADLINE_S)
            assert process.returncode == 0, stderr
            probes.append(Probe(**json.loads(stdout)))
        return probes
    finally:
        for process in processes:
            process.kill()
            process.wait(timeout=DEADLINE_S)


def _reach(where: str, server: Server, payload: str) -> Request:
    """From ``where``, send ``payload`` to the server and connect to it."""
    return Request(where, server.address, server.tcp_port, server.udp_port, payload)


def _knock(hosts: NetnsHosts, where: str, region: str) -> Request:
    """From ``where``, connect to a port of ``region``'s address where nothing listens."""
    return Request(where, hosts.address(region), CLOSED_PORT, CLOSED_PORT, "knock")


def _datagrams(hosts: NetnsHosts, server: Server) -> list[str]:
    """The payloads the server has received, asked from the client host (which is never cut)."""
    (probe,) = _probe_all(hosts, [_reach(CLIENT, server, "query")])
    assert probe.outcome == "connected", probe
    return probe.detail


def _wait_for_datagram(hosts: NetnsHosts, server: Server, payload: str) -> bool:
    deadline_at = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline_at:
        if payload in _datagrams(hosts, server):
            return True
    return False


def test_a_region_is_reachable_from_the_other_regions_and_the_client(
    hosts: NetnsHosts, server: Server
) -> None:
    assert hosts.partitions and hosts.reason == ""
    assert server.address == "10.213.1.2"
    probes = _probe_all(
        hosts,
        [_reach(where, server, f"open-from-{where}") for where in ["us", "ap", CLIENT]],
    )
    assert [probe.outcome for probe in probes] == ["connected"] * 3, probes
    for where in ["us", "ap", CLIENT]:
        assert _wait_for_datagram(hosts, server, f"open-from-{where}")


def test_a_cut_drops_packets_silently_both_ways_and_heal_restores_them(
    hosts: NetnsHosts, server: Server
) -> None:
    hosts.cut("eu", "us")
    assert hosts.cuts() == {frozenset({"eu", "us"})}
    us_to_eu, eu_to_us, ap_to_eu, client_to_eu = _probe_all(
        hosts,
        [
            _reach("us", server, "across-the-cut"),
            _knock(hosts, "eu", "us"),
            _reach("ap", server, "beside-the-cut"),
            _reach(CLIENT, server, "from-the-client"),
        ],
    )
    # Silent: each connect across the cut waited its whole timeout; an ICMP error would have
    # ended it at once.
    for across in (us_to_eu, eu_to_us):
        assert across.outcome == "timeout", across
        assert across.waited_s >= 0.9 * CONNECT_TIMEOUT_S, across
    assert ap_to_eu.outcome == "connected" and client_to_eu.outcome == "connected"
    assert _wait_for_datagram(hosts, server, "beside-the-cut")
    assert _wait_for_datagram(hosts, server, "from-the-client")
    # Sent a whole connect timeout before those two arrived, and not there.
    assert "across-the-cut" not in _datagrams(hosts, server)

    hosts.heal()
    assert hosts.cuts() == set()
    us_to_eu, eu_to_us = _probe_all(
        hosts, [_reach("us", server, "after-heal"), _knock(hosts, "eu", "us")]
    )
    assert us_to_eu.outcome == "connected", us_to_eu
    assert eu_to_us.outcome == "error" and eu_to_us.detail == ["Connection refused"], eu_to_us
    assert _wait_for_datagram(hosts, server, "after-heal")
    # Dropped, not held back: the datagram sent across the cut never comes.
    assert "across-the-cut" not in _datagrams(hosts, server)


def test_isolate_cuts_a_region_from_every_region_but_not_from_the_client(
    hosts: NetnsHosts, server: Server
) -> None:
    hosts.isolate("eu")
    assert hosts.cuts() == {frozenset({"eu", "us"}), frozenset({"eu", "ap"})}
    us_to_eu, ap_to_eu, eu_to_ap, client_to_eu, us_to_ap = _probe_all(
        hosts,
        [
            _reach("us", server, "from-us"),
            _reach("ap", server, "from-ap"),
            _knock(hosts, "eu", "ap"),
            _reach(CLIENT, server, "from-the-client"),
            _knock(hosts, "us", "ap"),
        ],
    )
    assert [us_to_eu.outcome, ap_to_eu.outcome, eu_to_ap.outcome] == ["timeout"] * 3
    assert client_to_eu.outcome == "connected", client_to_eu
    # us and ap still reach each other: an answer, even a refusal, came back at once.
    assert us_to_ap.outcome == "error" and us_to_ap.detail == ["Connection refused"], us_to_ap
    hosts.heal()
    (us_to_eu,) = _probe_all(hosts, [_reach("us", server, "after-heal")])
    assert us_to_eu.outcome == "connected", us_to_eu


def test_enter_client_moves_the_calling_process_onto_the_client_host(
    hosts: NetnsHosts, server: Server
) -> None:
    # enter_client() switches the process it runs in, so run it in a forked child; this
    # process must stay on the root network.
    network_before = os.readlink("/proc/self/ns/net")
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:
        status = 1
        try:
            os.close(read_end)
            hosts.enter_client()
            address = (server.address, server.tcp_port)
            with socket.create_connection(address, timeout=DEADLINE_S) as connection:
                os.write(write_end, connection.getsockname()[0].encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    try:
        with os.fdopen(read_end, "rb") as reader:
            local_address = reader.read().decode()
    finally:
        _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert local_address == hosts.client_address
    assert os.readlink("/proc/self/ns/net") == network_before


def test_close_removes_every_namespace_and_link_and_stops_no_process() -> None:
    _skip_without_netns()
    prefix = f"mjep-{os.getpid()}-"
    idle = [sys.executable, "-c", "import sys; sys.stdin.read()"]
    bystander = subprocess.Popen(idle, stdin=subprocess.PIPE)
    made = make_hosts(["eu", "us"])
    inside: subprocess.Popen[bytes] | None = None
    try:
        assert isinstance(made, NetnsHosts), made.reason
        assert {name for name in _namespaces() if name.startswith(prefix)} == {
            f"{prefix}rt",
            f"{prefix}cl",
            f"{prefix}r0",
            f"{prefix}r1",
        }
        inside = subprocess.Popen(made.command("eu", idle), stdin=subprocess.PIPE)
        made.close()
        made.close()
        assert not [name for name in _namespaces() if name.startswith(prefix)]
        links = subprocess.run(["ip", "-o", "link"], check=True, capture_output=True, text=True)
        assert f"mj{os.getpid()}" not in links.stdout
        assert bystander.poll() is None and inside.poll() is None
    finally:
        made.close()
        for process in (bystander, inside):
            if process is not None:
                process.kill()
                process.wait(timeout=DEADLINE_S)


def test_a_failed_creation_removes_what_it_made_and_nothing_else() -> None:
    _skip_without_netns()
    prefix = f"mjep-{os.getpid()}-"
    taken = f"{prefix}r1"
    subprocess.run(["ip", "netns", "add", taken], check=True)
    try:
        with pytest.raises(HostsError, match=f"netns add {taken} failed.*File exists"):
            NetnsHosts(["eu", "us"])
        assert {name for name in _namespaces() if name.startswith(prefix)} == {taken}
    finally:
        subprocess.run(["ip", "netns", "del", taken], check=False)


def test_sweep_removes_namespaces_of_dead_owners_only() -> None:
    _skip_without_netns()
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait(timeout=DEADLINE_S)
    stale = f"mjep-{finished.pid}-r0"
    alive = f"mjep-{os.getpid()}-r63"
    for name in (stale, alive):
        subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        removed = sweep()
        assert stale in removed and alive not in removed
        assert stale not in _namespaces() and alive in _namespaces()
    finally:
        for name in (stale, alive):
            subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)


def test_loopback_hosts_bind_loopback_addresses_and_cannot_partition() -> None:
    hosts = LoopbackHosts(REGIONS)
    assert [hosts.address(region) for region in REGIONS] == [
        "127.0.0.1",
        "127.0.0.2",
        "127.0.0.3",
    ]
    for region in REGIONS:
        with socket.socket() as listener:
            listener.bind((hosts.address(region), 0))
    assert not hosts.partitions and hosts.reason
    argv = [sys.executable, "-c", "pass"]
    assert hosts.command("us", argv) == argv and hosts.client_command(argv) == argv
    with pytest.raises(HostsError):
        hosts.cut("eu", "us")
    with pytest.raises(HostsError):
        hosts.isolate("eu")
    with pytest.raises(HostsError, match="unknown region"):
        hosts.address("mars")
    hosts.heal()
    assert hosts.cuts() == set()
    hosts.enter_client()
    hosts.close()
    declined = make_hosts(REGIONS, want_netns=False)
    assert isinstance(declined, LoopbackHosts) and "partitions are off" in declined.reason
