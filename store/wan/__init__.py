"""Wide-area emulation: a TCP proxy with per-link delay, jitter and partitions (docs/wan.md).

The kernel here has no netem qdisc and no iptables, so every inter-region connection of a
local multi-region cluster goes through this proxy instead.
"""

from store.wan.cli import main
from store.wan.commands import Command, InvalidCommand, parse_command
from store.wan.control import ControlError, ControlServer, send
from store.wan.delay import DelayLine
from store.wan.link import Address, InvalidLink, LinkSpec, parse_address, parse_link
from store.wan.proxy import BUFFER_BYTES_MAX, WanProxy
from store.wan.thread import ProxyThread

__all__ = [
    "BUFFER_BYTES_MAX",
    "Address",
    "Command",
    "ControlError",
    "ControlServer",
    "DelayLine",
    "InvalidCommand",
    "InvalidLink",
    "LinkSpec",
    "ProxyThread",
    "WanProxy",
    "main",
    "parse_address",
    "parse_command",
    "parse_link",
    "send",
]
