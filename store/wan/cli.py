"""``meridian wan-proxy``: run the wide-area emulation proxy until SIGINT or SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import tomllib
from pathlib import Path
from typing import Any

from store.wan.control import ControlServer
from store.wan.link import InvalidLink, LinkSpec, parse_address, parse_link
from store.wan.proxy import BUFFER_BYTES_MAX, WanProxy
from store.wan.thread import new_event_loop

_CONFIG_KEYS = {"delay_ms", "jitter_ms", "seed", "control", "buffer_bytes_max", "links"}
_LINK_KEYS = {"name", "listen", "target", "source", "delay_ms", "jitter_ms", "from", "to"}


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """The options; ``store/cli.py`` may pass its subparser to share them."""
    if parser is None:
        parser = argparse.ArgumentParser(
            prog="meridian wan-proxy",
            description="TCP proxy emulating wide-area delay, jitter and partitions.",
        )
    parser.add_argument(
        "--link",
        action="append",
        default=[],
        metavar="NAME=LISTEN>TARGET[@SOURCE]",
        help="a link, e.g. 'us-eu=127.0.0.1:17001>127.0.0.2:7001' (repeatable; quote the >); "
        "@SOURCE: host to connect to the target from",
    )
    parser.add_argument("--config", type=Path, help="TOML file with a [[links]] list")
    parser.add_argument("--delay-ms", type=float, help="one-way delay per direction (default 0)")
    parser.add_argument("--jitter-ms", type=float, help="jitter, uniform in +-jitter (default 0)")
    parser.add_argument("--seed", type=int, help="seed for jitter (default 0)")
    parser.add_argument("--control", help="control endpoint, HOST:PORT or unix:PATH")
    parser.add_argument(
        "--buffer-bytes-max",
        type=int,
        help=f"buffer per connection and direction (default {BUFFER_BYTES_MAX})",
    )
    return parser


def _config_links(config: dict[str, Any], delay_ms: float, jitter_ms: float) -> list[LinkSpec]:
    links = config.get("links", [])
    if not isinstance(links, list):
        raise InvalidLink("'links' must be a [[links]] list")
    specs = []
    for entry in links:
        if not isinstance(entry, dict):
            raise InvalidLink(f"[[links]] entry {entry!r} is not a table")
        unknown = sorted(set(entry) - _LINK_KEYS)
        missing = sorted({"name", "listen", "target"} - set(entry))
        if unknown or missing:
            raise InvalidLink(f"[[links]] entry {entry}: unknown {unknown}, missing {missing}")
        regions = frozenset(entry[k] for k in ("from", "to") if k in entry)
        if len(regions) not in {0, 2}:
            raise InvalidLink(f"link {entry['name']!r}: give both 'from' and 'to', different")
        specs.append(
            LinkSpec(
                str(entry["name"]),
                parse_address(str(entry["listen"])),
                parse_address(str(entry["target"])),
                entry.get("delay_ms", delay_ms),
                entry.get("jitter_ms", jitter_ms),
                regions,
                str(entry["source"]) if "source" in entry else None,
            )
        )
    return specs


def load(args: argparse.Namespace) -> tuple[list[LinkSpec], dict[str, Any]]:
    """Links and settings from the options, the config file filling in what they omit."""
    config: dict[str, Any] = {}
    if args.config is not None:
        config = tomllib.loads(args.config.read_text())
        unknown = sorted(set(config) - _CONFIG_KEYS)
        if unknown:
            raise InvalidLink(f"{args.config}: unknown key(s) {unknown}")

    def pick(option: Any, key: str, default: Any) -> Any:
        return option if option is not None else config.get(key, default)

    delay_ms = pick(args.delay_ms, "delay_ms", 0.0)
    jitter_ms = pick(args.jitter_ms, "jitter_ms", 0.0)
    links = _config_links(config, delay_ms, jitter_ms)
    links += [parse_link(text, delay_ms, jitter_ms) for text in args.link]
    if not links:
        raise InvalidLink("no links: give --link NAME=LISTEN>TARGET or --config FILE")
    settings = {
        "seed": pick(args.seed, "seed", 0),
        "control": pick(args.control, "control", None),
        "buffer_bytes_max": pick(args.buffer_bytes_max, "buffer_bytes_max", BUFFER_BYTES_MAX),
    }
    return links, settings


async def serve(links: list[LinkSpec], settings: dict[str, Any]) -> None:
    proxy = WanProxy(links, seed=settings["seed"], buffer_bytes_max=settings["buffer_bytes_max"])
    await proxy.start()
    control = None
    if settings["control"] is not None:
        control = ControlServer(proxy, settings["control"])
        await control.start()
    for name, link in proxy.links.items():
        print(
            f"wan-proxy link {name} {link.bound} > {link.spec.target} "
            f"delay_ms={link.delay_ms:g} jitter_ms={link.jitter_ms:g}",
            flush=True,
        )
    print(f"wan-proxy ready control={control.address if control else '-'}", flush=True)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stopping.set)
    await stopping.wait()
    if control is not None:
        await control.close()
    await proxy.close()


def run(args: argparse.Namespace) -> int:
    """Entry for an already-parsed namespace (``store/cli.py`` subcommand)."""
    try:
        links, settings = load(args)
    except (InvalidLink, OSError, tomllib.TOMLDecodeError) as error:
        print(f"meridian wan-proxy: {error}", file=sys.stderr)
        return 2
    loop = new_event_loop()
    try:
        loop.run_until_complete(serve(links, settings))
    except OSError as error:
        print(f"meridian wan-proxy: {error}", file=sys.stderr)
        return 1
    finally:
        loop.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))
