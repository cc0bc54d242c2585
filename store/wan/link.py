"""Links: what the proxy forwards, and how a link is named on the command line.

A link is one listening address whose accepted connections are forwarded to one target
address, with the same one-way delay and jitter in each direction. A link between two
regions names them, so that a nemesis can cut "eu from everything" without knowing the
ports: a link named ``SRC-DST`` or ``SRC-DST/ANYTHING`` (``us-eu``, ``us-eu/shard0``) joins
regions ``SRC`` and ``DST`` unless the configuration names the regions explicitly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# A wide-area delay beyond a minute is a typo, not an emulation.
DELAY_MS_MAX = 60_000.0

_NAME = re.compile(r"^[A-Za-z0-9_.:/-]{1,128}$")
_REGION_PAIR = re.compile(r"^([A-Za-z0-9_]+)-([A-Za-z0-9_]+)(?:/.*)?$")


class InvalidLink(ValueError):
    """A link specification that cannot be used (bad name, address or delay)."""


@dataclass(frozen=True)
class Address:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def parse_address(text: str) -> Address:
    """``HOST:PORT`` (IPv4 or a name; ``[v6]:PORT`` for IPv6) into an ``Address``."""
    host, sep, port_text = text.strip().rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise InvalidLink(f"address {text!r} is not HOST:PORT")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise InvalidLink(f"address {text!r}: port out of range")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return Address(host, port)


def check_delay(delay_ms: object, jitter_ms: object) -> tuple[float, float]:
    """Validated (delay_ms, jitter_ms) as floats; ``InvalidLink`` otherwise."""
    values = []
    for label, value in (("delay_ms", delay_ms), ("jitter_ms", jitter_ms)):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidLink(f"{label} must be a number, not {value!r}")
        if not 0 <= value <= DELAY_MS_MAX:
            raise InvalidLink(f"{label} must be between 0 and {DELAY_MS_MAX:g}, not {value!r}")
        values.append(float(value))
    return values[0], values[1]


def regions_of(name: str) -> frozenset[str]:
    """The region pair a link name implies (empty if the name implies none)."""
    match = _REGION_PAIR.match(name)
    return frozenset(match.groups()) if match else frozenset()


@dataclass(frozen=True)
class LinkSpec:
    """One proxied link. ``listen`` may use port 0; the proxy reports the bound port."""

    name: str
    listen: Address
    target: Address
    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    regions: frozenset[str] = field(default=frozenset())
    # Host the proxy connects to the target from, so that the target sees the caller's
    # region address (e.g. 127.0.0.2 for a link carrying eu's calls); None lets the kernel
    # choose.
    source: str | None = None

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise InvalidLink(f"link name {self.name!r}: use 1-128 of A-Z a-z 0-9 _ . : / -")
        check_delay(self.delay_ms, self.jitter_ms)
        if not self.regions:
            object.__setattr__(self, "regions", regions_of(self.name))


def parse_link(text: str, delay_ms: float = 0.0, jitter_ms: float = 0.0) -> LinkSpec:
    """``NAME=LISTEN>TARGET[@SOURCE]``, e.g. ``us-eu=127.0.0.1:17001>127.0.0.2:7001``."""
    name, sep, rest = text.partition("=")
    listen, arrow, target = rest.partition(">")
    if not sep or not arrow:
        raise InvalidLink(f"link {text!r} is not NAME=LISTEN>TARGET[@SOURCE]")
    target, at, source = target.partition("@")
    if at and not source.strip():
        raise InvalidLink(f"link {text!r}: empty source host after @")
    return LinkSpec(
        name.strip(),
        parse_address(listen),
        parse_address(target),
        delay_ms,
        jitter_ms,
        source=source.strip() or None,
    )
