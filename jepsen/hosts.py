"""Hosts for the Jepsen-style harness: each region on its own network, so partitions are real.

Jepsen runs every database node on its own machine and cuts the network between them; the
clients sit on a control node that keeps reaching every database node throughout. We do the
same on one Linux machine with network namespaces. Each "host" is a namespace:

- one router (``mjep-<pid>-rt``) that forwards packets (``net.ipv4.ip_forward=1``);
- one namespace per region (``mjep-<pid>-r0``, ``mjep-<pid>-r1``, ...) where that region's
  servers run and bind the region's address;
- one client namespace (``mjep-<pid>-cl``) for the clients.

Every host namespace is joined to the router by its own veth pair, on its own /24: link ``k``
is ``10.213.k.0/24``, the host's end is ``.2`` and the router's end is ``.1``, and the host's
default route points at the router. The client is link 0, region ``i`` is link ``i + 1``, so a
region's address is ``10.213.<i+1>.2``, the same last-but-one number as its loopback address
``127.0.0.<i+1>``. The range is private and none of it is used on the machine this was written
on; a clash could not hurt anyway, because no namespace has a link to the root namespace.

Every packet between two hosts therefore crosses the router, and the router is where a
partition is made: ``cut(a, b)`` adds two policy rules there,
``ip rule add from <subnet a> to <subnet b> blackhole`` and the reverse. Why this shape:

- The drop is silent, as when a real network loses a link. A forwarded packet that hits a
  ``blackhole`` rule is freed without an answer: no ICMP error goes back, so a TCP connect
  across a cut waits out its whole timeout and a datagram just never arrives. Measured on
  Linux 6.18 while writing this: a 3 s connect across a cut timed out after 3.005 s, while the
  same rule with ``unreachable`` instead of ``blackhole`` failed the connect after 3 ms with
  ``ENETUNREACH`` -- which a real partition never does, and which would let the servers tell
  a partition from a crash. (The kernel drops without a reply because a ``blackhole`` rule
  makes the route lookup fail with ``EINVAL``, and the router's error handler sends ICMP for
  every other error but not that one.)
- Clients keep reaching every region. Rules name region subnets only, so the client's link is
  never cut, as in Jepsen where partitions are between database nodes only.
- No iptables, nftables or tc is needed: only ``ip``.

Namespace names carry the owner's pid so that ``sweep()`` can remove the ones a dead run left
behind. Veth pairs are created directly inside their two namespaces (``ip link add ... netns``),
so they never exist in the root namespace, not even for a moment; deleting the namespaces
deletes them. Their names are ``mj<pid>h<tag>`` (the host's end) and ``mj<pid>g<tag>`` (the
router's, "gateway", end), where tag is ``cl`` or ``r<i>``; Linux allows 15 bytes.

When partitions are unavailable (not root, no ``ip``, namespaces refused), ``make_hosts``
falls back to ``LoopbackHosts``: region ``i`` binds ``127.0.0.<i+1>``, processes run as they
are, and ``reason`` says why partitions are off.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import re
import shutil
import subprocess
from abc import ABC, abstractmethod
from pathlib import Path
from types import TracebackType

__all__ = [
    "Hosts",
    "HostsError",
    "LoopbackHosts",
    "NetnsHosts",
    "make_hosts",
    "sweep",
]

NAMESPACE_PREFIX = "mjep-"
# Where `ip netns add` mounts a namespace, so that it outlives the processes inside it.
NETNS_DIR = Path("/var/run/netns")
# Link k is LINK_NETWORK.k.0/24. Link 0 is the client's; region i is link i + 1.
LINK_NETWORK = "10.213"
CLIENT_LINK = 0
# Each region takes a /24 of LINK_NETWORK and a 127.0.0.x address; both stop at 254. A cut's
# rule priority is CUT_PRIORITY_BASE + source * REGIONS_MAX + destination, below the main
# table's 32766, so the rules are consulted before any route.
REGIONS_MAX = 64
CUT_PRIORITY_BASE = 1000
INTERFACE_NAME_BYTES_MAX = 15
# Every `ip` call is local and quick; one that hangs is a broken machine, not a slow one.
IP_COMMAND_TIMEOUT_S = 10.0
# From <sched.h>: setns(2) with this flag switches the network namespace only.
CLONE_NEWNET = 0x40000000

_OWNED_NAMESPACE = re.compile(re.escape(NAMESPACE_PREFIX) + r"(?P<pid>[0-9]+)-(?P<tag>[a-z0-9]+)")


class HostsError(Exception):
    """A host could not be made, changed or removed; or partitions are asked of loopback."""


class Hosts(ABC):
    """Where each region's processes run and what address they bind; partitions between regions.

    ``regions`` are the region names in order; ``partitions`` is True when ``cut`` and
    ``isolate`` work; ``reason`` says why they do not ('' when they do). Use as a context
    manager, or call ``close()``.
    """

    regions: list[str]
    partitions: bool
    reason: str

    def __init__(self, regions: list[str], partitions: bool, reason: str) -> None:
        if not regions:
            raise HostsError("no regions")
        if len(set(regions)) != len(regions):
            raise HostsError(f"region names repeat: {regions}")
        if len(regions) > REGIONS_MAX:
            raise HostsError(f"{len(regions)} regions; at most {REGIONS_MAX}")
        self.regions = list(regions)
        self.partitions = partitions
        self.reason = reason

    @abstractmethod
    def address(self, region: str) -> str:
        """The IPv4 address that this region's servers bind to."""

    @abstractmethod
    def command(self, region: str, argv: list[str]) -> list[str]:
        """The argv that runs ``argv`` on this region's host."""

    @abstractmethod
    def client_command(self, argv: list[str]) -> list[str]:
        """The argv that runs ``argv`` on the client host."""

    @abstractmethod
    def enter_client(self) -> None:
        """Move the calling thread, and the threads it creates later, onto the client host."""

    @abstractmethod
    def cut(self, a: str, b: str) -> None:
        """Drop every packet between regions ``a`` and ``b``, both ways, without an answer."""

    def isolate(self, region: str) -> None:
        """Cut ``region`` from every other region; the client still reaches it."""
        self._index(region)
        for other in self.regions:
            if other != region:
                self.cut(region, other)

    @abstractmethod
    def heal(self) -> None:
        """Remove every cut."""

    @abstractmethod
    def cuts(self) -> set[frozenset[str]]:
        """The pairs of regions that are cut now."""

    @abstractmethod
    def close(self) -> None:
        """Remove everything made; a second call does nothing."""

    def _index(self, region: str) -> int:
        try:
            return self.regions.index(region)
        except ValueError:
            raise HostsError(f"unknown region {region!r}; regions are {self.regions}") from None

    def __enter__(self) -> Hosts:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


class LoopbackHosts(Hosts):
    """Every region on this machine's loopback: region ``i`` binds ``127.0.0.<i+1>``.

    Linux delivers all of 127.0.0.0/8 to ``lo``, so these addresses need no set-up. Nothing
    can be cut: ``cut`` and ``isolate`` raise ``HostsError`` with ``reason``.
    """

    def __init__(
        self,
        regions: list[str],
        reason: str = "loopback hosts share one network; partitions are off",
    ) -> None:
        super().__init__(regions, partitions=False, reason=reason)

    def address(self, region: str) -> str:
        return f"127.0.0.{self._index(region) + 1}"

    def command(self, region: str, argv: list[str]) -> list[str]:
        self._index(region)
        return list(argv)

    def client_command(self, argv: list[str]) -> list[str]:
        return list(argv)

    def enter_client(self) -> None:
        pass

    def cut(self, a: str, b: str) -> None:
        raise HostsError(f"cannot cut {a} from {b}: {self.reason}")

    def isolate(self, region: str) -> None:
        raise HostsError(f"cannot isolate {region}: {self.reason}")

    def heal(self) -> None:
        pass

    def cuts(self) -> set[frozenset[str]]:
        return set()

    def close(self) -> None:
        pass


class NetnsHosts(Hosts):
    """Each region, the client and a router in their own network namespace (see the module).

    Needs root (CAP_SYS_ADMIN). Creation either finishes or removes what it made and raises
    ``HostsError`` naming the failing command and its stderr. ``close()`` runs at exit too.
    Processes started with ``command()`` belong to the caller: ``close()`` does not stop them;
    a namespace with a process still inside lives on without its link until the process ends.
    """

    def __init__(self, regions: list[str]) -> None:
        super().__init__(regions, partitions=True, reason="")
        self._owner_pid = os.getpid()
        self.router_namespace = _namespace_name(self._owner_pid, "rt")
        self.client_namespace = _namespace_name(self._owner_pid, "cl")
        self.region_namespaces = [
            _namespace_name(self._owner_pid, f"r{index}") for index in range(len(regions))
        ]
        self.client_address = _host_address(CLIENT_LINK)
        # Only the namespaces this object created, so that a failed creation (a name already
        # taken by another instance, say) never removes someone else's.
        self._made: list[str] = []
        # The priorities of the router rules that make each cut, to delete them one by one.
        self._cut_priorities: dict[frozenset[str], list[int]] = {}
        atexit.register(self.close)
        try:
            self._build()
        except BaseException:
            # The creation error matters more than a failure to clean up after it.
            with contextlib.suppress(HostsError):
                self.close()
            raise

    def _build(self) -> None:
        self._add_namespace(self.router_namespace)
        _ip("netns", "exec", self.router_namespace, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        self._add_namespace(self.client_namespace)
        self._link(self.client_namespace, CLIENT_LINK, "cl")
        for index, namespace in enumerate(self.region_namespaces):
            self._add_namespace(namespace)
            self._link(namespace, _region_link(index), f"r{index}")

    def _add_namespace(self, namespace: str) -> None:
        _ip("netns", "add", namespace)
        self._made.append(namespace)
        _ip("-n", namespace, "link", "set", "lo", "up")

    def _link(self, namespace: str, link: int, tag: str) -> None:
        host_end = f"mj{self._owner_pid}h{tag}"
        router_end = f"mj{self._owner_pid}g{tag}"
        assert len(host_end.encode()) <= INTERFACE_NAME_BYTES_MAX, host_end
        router = self.router_namespace
        _ip(
            "link", "add", host_end, "netns", namespace, "type", "veth",
            "peer", "name", router_end, "netns", router,
        )  # fmt: skip
        _ip("-n", namespace, "addr", "add", f"{_host_address(link)}/24", "dev", host_end)
        _ip("-n", router, "addr", "add", f"{_router_address(link)}/24", "dev", router_end)
        _ip("-n", namespace, "link", "set", host_end, "up")
        _ip("-n", router, "link", "set", router_end, "up")
        _ip("-n", namespace, "route", "add", "default", "via", _router_address(link))

    def address(self, region: str) -> str:
        return _host_address(_region_link(self._index(region)))

    def command(self, region: str, argv: list[str]) -> list[str]:
        # `ip netns exec` switches namespace and then execs argv, so the process it starts is
        # the caller's child itself: its pid is the one to signal.
        return ["ip", "netns", "exec", self.region_namespaces[self._index(region)], *argv]

    def client_command(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.client_namespace, *argv]

    def enter_client(self) -> None:
        """Move the calling thread onto the client host.

        A network namespace belongs to a thread: this switches the calling thread, and every
        thread or process it creates afterwards starts there. Threads that already exist stay
        where they are, and sockets already open stay on the network they were opened on. So
        call it first thing in a process made for clients, before any socket, thread or event
        loop exists -- never in a process that must stay on the root network (a test runner).
        """
        _enter_network_namespace(self.client_namespace)

    def cut(self, a: str, b: str) -> None:
        index_a, index_b = self._index(a), self._index(b)
        if index_a == index_b:
            raise HostsError(f"cannot cut {a} from itself")
        pair = frozenset((a, b))
        if pair in self._cut_priorities:
            return
        # Recorded before the rules go in, so that heal() removes half a cut if the second
        # rule fails.
        priorities = self._cut_priorities[pair] = []
        for source, destination in ((index_a, index_b), (index_b, index_a)):
            priority = CUT_PRIORITY_BASE + source * REGIONS_MAX + destination
            _ip(
                "-n", self.router_namespace, "rule", "add",
                "from", _subnet(_region_link(source)), "to", _subnet(_region_link(destination)),
                "blackhole", "pref", str(priority),
            )  # fmt: skip
            priorities.append(priority)

    def heal(self) -> None:
        for pair, priorities in list(self._cut_priorities.items()):
            while priorities:
                _ip("-n", self.router_namespace, "rule", "del", "pref", str(priorities[-1]))
                priorities.pop()
            del self._cut_priorities[pair]

    def cuts(self) -> set[frozenset[str]]:
        return set(self._cut_priorities)

    def close(self) -> None:
        # A process forked from the owner (multiprocessing, say) inherits this object and its
        # atexit registration; it must not tear down the owner's hosts when it exits.
        if os.getpid() != self._owner_pid:
            return
        failures: list[str] = []
        kept: list[str] = []
        # The router first: once it is gone no link is left, even in a region namespace that
        # a still-running process keeps alive.
        for namespace in self._made:
            try:
                _ip("netns", "del", namespace)
            except HostsError as error:
                if (NETNS_DIR / namespace).exists():
                    failures.append(str(error))
                    kept.append(namespace)
        self._made = kept
        self._cut_priorities.clear()
        if failures:
            raise HostsError("; ".join(failures))
        atexit.unregister(self.close)


def make_hosts(regions: list[str], want_netns: bool = True) -> Hosts:
    """Network-namespace hosts when they can be made, else loopback hosts saying why not."""
    if not want_netns:
        return LoopbackHosts(regions, "network namespaces were not asked for; partitions are off")
    if os.geteuid() != 0:
        return LoopbackHosts(
            regions, "not root: network namespaces need CAP_SYS_ADMIN; partitions are off"
        )
    if shutil.which("ip") is None:
        return LoopbackHosts(
            regions, "the ip command (iproute2) is not installed; partitions are off"
        )
    try:
        return NetnsHosts(regions)
    except HostsError as error:
        return LoopbackHosts(
            regions, f"network namespaces could not be made ({error}); partitions are off"
        )


def sweep() -> list[str]:
    """Remove the namespaces that earlier runs left behind; return their names.

    A namespace is stale when the pid in its name is no longer running. A pid the system has
    since given to another process keeps its namespaces until that process ends too.
    """
    removed = []
    for line in _ip("netns", "list").splitlines():
        name = line.split(" ", 1)[0]
        match = _OWNED_NAMESPACE.fullmatch(name)
        if match is None or _process_alive(int(match["pid"])):
            continue
        _ip("netns", "del", name)
        removed.append(name)
    return removed


def _ip(*arguments: str) -> str:
    """Run ``ip`` with ``arguments``; return its stdout or raise HostsError with its stderr."""
    argv = ["ip", *arguments]
    try:
        result = subprocess.run(
            argv, check=False, capture_output=True, text=True, timeout=IP_COMMAND_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise HostsError(f"{' '.join(argv)}: {error}") from error
    if result.returncode != 0:
        raise HostsError(
            f"{' '.join(argv)} failed (exit {result.returncode}): {result.stderr.strip()}"
        )
    return result.stdout


def _enter_network_namespace(namespace: str) -> None:
    # os.setns arrives in Python 3.12; on 3.11 call libc's setns(2) directly.
    libc = ctypes.CDLL(None, use_errno=True)
    path = NETNS_DIR / namespace
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as error:
        raise HostsError(f"cannot open {path}: {error}") from error
    try:
        if libc.setns(descriptor, CLONE_NEWNET) != 0:
            error_number = ctypes.get_errno()
            raise HostsError(f"setns({path}) failed: {os.strerror(error_number)}")
    finally:
        os.close(descriptor)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _namespace_name(pid: int, tag: str) -> str:
    return f"{NAMESPACE_PREFIX}{pid}-{tag}"


def _region_link(index: int) -> int:
    return index + 1


def _subnet(link: int) -> str:
    return f"{LINK_NETWORK}.{link}.0/24"


def _host_address(link: int) -> str:
    return f"{LINK_NETWORK}.{link}.2"


def _router_address(link: int) -> str:
    return f"{LINK_NETWORK}.{link}.1"
