"""docs/configuration.md, made from the definitions themselves.

Every settings object documents its fields where they are defined: a comment on the lines
just above a field (shared by the fields that follow it up to a blank line or the next
comment), or at the end of its line; ``RpcSettings`` lists them in its docstring
(``name: meaning``). The sections that are not settings objects are ``store.config.STRUCTURE``.
``reference()`` puts them together with each field's default and unit;
``meridian config-reference`` prints it, and ``tests/cluster/test_config_reference.py``
fails when the file differs from it or a field has no documentation.
"""

from __future__ import annotations

import ast
import dataclasses
import io
import re
import sys
import tokenize
from pathlib import Path
from typing import Any

from store import config as config_module
from store.client.protocol import ClientSettings
from store.core.settings import DEFAULT_SETTINGS, DEFAULT_STREAM_SETTINGS
from store.corebuild import source_path
from store.rpc.settings import RpcSettings

_FIELD = re.compile(r"^\s+([a-z_][a-z0-9_]*)\s*:\s*[^=]+=")


class MissingDocumentation(Exception):
    """A settings field without a comment or docstring entry."""


def _class_source(cls: type) -> str:
    """The source of ``cls``, from its module's ``.py`` file: ``inspect.getsource`` has
    none for a class of the compiled core (docs/performance.md)."""
    path = Path(sys.modules[cls.__module__].__file__ or "")
    if path.suffix != ".py":  # the compiled core's extension module: its source beside it
        path = source_path(cls.__module__)
    text = path.read_text()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef) and node.name == cls.__name__:
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            assert node.end_lineno is not None
            return "\n".join(text.splitlines()[first - 1 : node.end_lineno]) + "\n"
    raise LookupError(f"no class {cls.__name__} in {path}")


def comment_docs(cls: type) -> dict[str, str]:
    """Field -> its comment, from the class's source (see the module doc)."""
    source = _class_source(cls)
    comments: dict[int, str] = {}  # line -> text of a comment alone on its line / trailing
    trailing: dict[int, str] = {}
    lines = source.splitlines()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            row = token.start[0]
            text = token.string.lstrip("#").strip()
            if lines[row - 1].strip().startswith("#"):
                comments[row] = text
            else:
                trailing[row] = text
    docs: dict[str, str] = {}
    block: list[str] = []
    for row, line in enumerate(lines, start=1):
        if row in comments:
            if block and row - 1 not in comments:
                block = []  # a new comment after fields: it starts a new block
            block.append(comments[row])
            continue
        if not line.strip():
            block = []
            continue
        match = _FIELD.match(line)
        if match is None:
            continue
        name = match.group(1)
        text = trailing.get(row) or " ".join(block)
        if text:
            docs[name] = text
    return docs


def docstring_docs(cls: type) -> dict[str, str]:
    """Field -> meaning, from ``name: meaning`` paragraphs of the class docstring."""
    docs: dict[str, str] = {}
    current: str | None = None
    for line in (cls.__doc__ or "").splitlines():
        match = re.match(r"^\s{4}([a-z_][a-z0-9_]*): (.*)$", line)
        if match:
            current = match.group(1)
            docs[current] = match.group(2).strip()
        elif current is not None and line.strip() and line.startswith("        "):
            docs[current] += " " + line.strip()
        else:
            current = None
    return docs


def _unit(name: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true / false"
    if name.endswith("_ns"):
        return "nanoseconds"
    if name.endswith("_ms"):
        return "milliseconds"
    if name.endswith("_s"):
        return "seconds"
    if name.endswith("_bytes") or "_bytes_" in name:
        return "bytes"
    if isinstance(value, int):
        return "count"
    return type(value).__name__


def _default(name: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and name.endswith("_ns") and value >= 1_000_000:
        return f"{value:_} ({value / 1e6:g} ms)"
    if isinstance(value, int) and value >= 10_000:
        return f"{value:_}"
    return repr(value)


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


def _settings_table(title: str, intro: str, instance: Any, docs: dict[str, str]) -> list[str]:
    lines = [f"## `[{title}]`", "", intro, "", "| key | default | unit | meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(instance):
        if f.name not in docs:
            raise MissingDocumentation(f"[{title}] {f.name} has no documentation at its definition")
        value = getattr(instance, f.name)
        lines.append(
            f"| `{f.name}` | `{_default(f.name, value)}` | {_unit(f.name, value)} | "
            f"{_escape(docs[f.name])} |"
        )
    return [*lines, ""]


def _structure_table(title: str, intro: str, keys: dict[str, tuple[str, Any, str]]) -> list[str]:
    lines = [f"## `{title}`", "", intro, "", "| key | type | default | meaning |", "|---|---|---|---|"]
    for key, (kind, default, meaning) in keys.items():
        shown = "required" if default is None else f"`{default!r}`"
        lines.append(f"| `{key}` | {kind} | {shown} | {_escape(meaning)} |")
    return [*lines, ""]


def reference() -> str:
    """The text of docs/configuration.md."""
    structure = config_module.STRUCTURE
    client_docs = comment_docs(ClientSettings)
    lines = [
        "# Configuration reference",
        "",
        "A cluster file is TOML. This page lists every section and every key it takes, with",
        "its default, unit and meaning; it is generated from the definitions",
        "(`meridian config-reference > docs/configuration.md`), and a test fails when it is",
        "out of date. Any key not listed here, a value of the wrong type or a negative number",
        "is refused when the file is loaded, with a `ConfigError` naming the section and the",
        "key. Times are integers of nanoseconds in `[settings]`, `[stream]` and `[rpc]`",
        "(`_ns`), floats of seconds in `[client]` (`_s`).",
        "",
    ]
    lines += _structure_table("[cluster]", "The cluster as a whole.", structure["cluster"])
    lines += _structure_table("[[regions]]", "One table per region, in any order.", structure["regions"])
    lines += _structure_table(
        "[[shards]]", "One table per shard; shards are numbered in file order.", structure["shards"]
    )
    lines += _structure_table(
        "followers (in [[shards]])", "Each entry of a shard's `followers` list.", structure["followers"]
    )
    lines += _structure_table(
        "[[cm]]",
        "The configuration manager: one member per region (needed for failover).",
        structure["cm"],
    )
    lines += _structure_table(
        "[security]",
        "Mutual TLS between regions and the cluster secret of RPC sessions "
        "(docs/security.md). `meridian certs --config FILE` makes the files it names.",
        structure["security"],
    )
    lines += _structure_table(
        "[placement]",
        "Which shard holds a key (docs/api.md, placement). Without it, `[cluster] partitioner` "
        "decides alone.",
        structure["placement"],
    )
    lines += _structure_table(
        "[wan]",
        "Wide-area emulation on one machine: every replication connection between regions "
        "goes through one `meridian wan-proxy`.",
        structure["wan"],
    )
    lines += _settings_table(
        "settings", "The servers' limits and timings (`store/core/settings.py`, `Settings`).",
        DEFAULT_SETTINGS, comment_docs(type(DEFAULT_SETTINGS)),
    )
    lines += _settings_table(
        "stream",
        "Each replication stream's batching, pipelining and timers (`StreamSettings`).",
        DEFAULT_STREAM_SETTINGS, comment_docs(type(DEFAULT_STREAM_SETTINGS)),
    )
    rpc = config_module.MERIDIAN_RPC_SETTINGS
    lines += _settings_table(
        "rpc",
        "The RPC core's limits (`store/rpc/settings.py`); both ends of a session must agree. "
        "Meridian's defaults differ from eRPC's in the window (64 requests and credits per "
        "session) and the session table (2048).",
        rpc, docstring_docs(RpcSettings),
    )
    lines += _settings_table(
        "client",
        "The SDK's settings (`ClientSettings`); `Client.connect`'s keyword arguments "
        "override them.",
        ClientSettings(), client_docs,
    )
    for key, (kind, _, meaning) in config_module.CLIENT_EXTRA.items():
        lines.append(f"`[client] {key}` ({kind}, optional): {meaning}.")
    return "\n".join(lines).rstrip() + "\n"
