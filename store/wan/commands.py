"""Run-time commands: the control protocol's vocabulary, parsed and checked before use.

A command is a JSON object with an ``op`` and, for ops that act on links, exactly one
selector:

- ``"link": NAME`` — a link name, or a shell-style pattern (``"us-*"``, ``"*"``);
- ``"region": R`` — every link with ``R`` at one end ("region eu from everything");
- ``"between": [A, B]`` — every link joining regions ``A`` and ``B``.

Ops: ``partition`` (with ``"mode": "drop" | "hold"``), ``heal``, ``set_delay`` (with
``"delay_ms"`` and optionally ``"jitter_ms"``), ``status`` (selector optional) and ``ping``.
A command is parsed in full before anything happens, so a bad one changes nothing; its
error names what is wrong.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from store.wan.link import InvalidLink, check_delay

MODES = ("drop", "hold")
_SELECTORS = ("link", "region", "between")
_FIELDS = {
    "ping": set(),
    "status": set(),
    "partition": {"mode"},
    "heal": set(),
    "set_delay": {"delay_ms", "jitter_ms"},
}


class InvalidCommand(ValueError):
    """A control command that is malformed or matches no link; nothing was changed."""


@dataclass(frozen=True)
class Selector:
    link: str | None = None
    region: str | None = None
    between: tuple[str, str] | None = None

    def matches(self, name: str, regions: frozenset[str]) -> bool:
        if self.link is not None:
            return fnmatch.fnmatchcase(name, self.link)
        if self.region is not None:
            return self.region in regions
        if self.between is not None:
            return regions == frozenset(self.between)
        return True  # no selector: every link (only ``status`` allows it)

    def describe(self) -> str:
        if self.link is not None:
            return f"link {self.link!r}"
        if self.region is not None:
            return f"region {self.region!r}"
        if self.between is not None:
            return f"between {self.between[0]!r} and {self.between[1]!r}"
        return "all links"


@dataclass(frozen=True)
class Command:
    op: str
    selector: Selector
    mode: str | None = None
    delay_ms: float | None = None
    jitter_ms: float | None = None

    def select(self, links: Iterable[tuple[str, frozenset[str]]]) -> list[str]:
        """Names of the links this command acts on; ``InvalidCommand`` if there are none."""
        names = [name for name, regions in links if self.selector.matches(name, regions)]
        if not names and self.op not in {"status", "ping"}:
            raise InvalidCommand(f"no link matches {self.selector.describe()}")
        return names


def _text(raw: Mapping[str, Any], key: str) -> str:
    value = raw[key]
    if not isinstance(value, str) or not value:
        raise InvalidCommand(f"{key!r} must be a non-empty string, not {value!r}")
    return value


def parse_command(raw: object) -> Command:
    """Check a decoded JSON command; ``InvalidCommand`` says what is wrong."""
    if not isinstance(raw, dict):
        raise InvalidCommand(f"a command is a JSON object, not {type(raw).__name__}")
    op = raw.get("op")
    if not isinstance(op, str) or op not in _FIELDS:
        raise InvalidCommand(f"unknown op {op!r}; ops are {', '.join(sorted(_FIELDS))}")
    allowed = {"op", *_SELECTORS, *_FIELDS[op]} if op != "ping" else {"op"}
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise InvalidCommand(f"{op}: unknown field(s) {', '.join(map(repr, unknown))}")

    given = [key for key in _SELECTORS if key in raw]
    if len(given) > 1:
        raise InvalidCommand(f"{op}: give one of link, region, between, not {given}")
    if not given and op in {"partition", "heal", "set_delay"}:
        raise InvalidCommand(f"{op}: say which links with 'link', 'region' or 'between'")
    selector = Selector()
    if "link" in raw:
        selector = Selector(link=_text(raw, "link"))
    elif "region" in raw:
        selector = Selector(region=_text(raw, "region"))
    elif "between" in raw:
        pair = raw["between"]
        if (
            not isinstance(pair, list)
            or len(pair) != 2
            or not all(isinstance(r, str) and r for r in pair)
            or pair[0] == pair[1]
        ):
            raise InvalidCommand(f"'between' must be two different region names, not {pair!r}")
        selector = Selector(between=(pair[0], pair[1]))

    if op == "partition":
        mode = raw.get("mode")
        if mode not in MODES:
            raise InvalidCommand(f"partition: 'mode' must be 'drop' or 'hold', not {mode!r}")
        return Command(op, selector, mode=mode)
    if op == "set_delay":
        if "delay_ms" not in raw:
            raise InvalidCommand("set_delay: 'delay_ms' is required")
        try:
            delay_ms, jitter_ms = check_delay(raw["delay_ms"], raw.get("jitter_ms", 0))
        except InvalidLink as error:
            raise InvalidCommand(f"set_delay: {error}") from None
        return Command(
            op, selector, delay_ms=delay_ms, jitter_ms=jitter_ms if "jitter_ms" in raw else None
        )
    return Command(op, selector)
