"""What a Jepsen-style run leaves in its directory besides ``history.edn``.

The harness (``jepsen/run.py``) records a history, checks it, and calls these functions to
fill ``runs/jepsen/<test-name>/<timestamp>/`` the way Jepsen fills ``store/<test>/<time>/``:

- ``results.edn``: the checkers' verdicts, written by `write_results`;
- ``latency-raw.png``: every completed operation's latency against its invocation time
  (`plot_latency`);
- ``rate.png``: completions per second (`plot_rate`);
- ``timeline.html``: one column per process, one box per operation (`write_timeline`);
- the text `summary` printed when the run ends.

Faults come from the history itself, not from the nemesis's own bookkeeping, so a history
read back from disk gives the same pictures. Jepsen's nemesis writes each fault action as a
pair of operations of ``process :nemesis``: the invocation (``:invoke``, or ``:info`` as
Jepsen itself writes it) and the ``:info`` completion that says what was done. An action
takes effect at its completion. ``start-X`` opens a fault of kind ``X`` and ``stop-X`` heals
it; any other action (``restart``) is instantaneous. A fault not healed by the end of the
history stays open (``end_s is None``) and is drawn to the end of the run.

Times in the history are nanoseconds since the run began; everything here is in seconds,
except latencies on the plots, which are in milliseconds as Jepsen draws them.
"""

from __future__ import annotations

import dataclasses
import html
import math
import numbers
import os
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jepsen.edn import EdnError, EdnList, Keyword, Symbol, Tagged, dumps, loads
from jepsen.history import Op, format_op

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = [
    "Fault",
    "faults_from_history",
    "latencies",
    "plot_latency",
    "plot_rate",
    "summary",
    "write_results",
    "write_timeline",
]

NEMESIS = "nemesis"
COMPLETION_TYPES = ("ok", "fail", "info")
NS_PER_S = 1_000_000_000

# Jepsen's colours (jepsen.checker.perf and jepsen.checker.timeline).
PLOT_TYPE_COLOURS = {"ok": "#81BFFC", "fail": "#FF1E90", "info": "#FFA400"}
TIMELINE_TYPE_COLOURS = {"ok": "#6DB6FE", "fail": "#FEB5DA", "info": "#FFAA26"}
FAULT_COLOURS = {
    "kill": "#F4A6A6",
    "pause": "#F9DF8C",
    "partition": "#B9B4EE",
    "restart": "#8FCB9B",
}
# Kinds of fault this module does not know get these, in order of first appearance.
FAULT_COLOURS_EXTRA = ("#A6DCEF", "#D5D5D5", "#F2C6E8", "#C8E6A0")
F_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")

PLOT_SIZE_INCHES = (10.0, 4.5)
PLOT_DPI = 100
# A log axis cannot show zero; an operation faster than this is drawn at this latency.
LATENCY_MS_MIN = 0.001
RATE_BUCKET_S = 1.0

# The timeline scales time so that the median operation is TIMELINE_MEDIAN_OP_PX tall, within
# a page height browsers lay out without trouble.
TIMELINE_MEDIAN_OP_PX = 12.0
TIMELINE_HEIGHT_PX_MIN = 600.0
TIMELINE_HEIGHT_PX_MAX = 400_000.0
TIMELINE_BOX_PX_MIN = 2.0
TIMELINE_COLUMN_PX = 60
TIMELINE_NEMESIS_LANE_PX = 110
TIMELINE_RULER_PX = 70
TIMELINE_HEADER_PX = 22
TIMELINE_TICK_PX_MIN = 50.0
TIMELINE_TICK_STEPS_S = (
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5,
    1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0,
)  # fmt: skip
TOOLTIP_VALUE_CHARS_MAX = 300

SUMMARY_FAULTS_MAX = 8
SUMMARY_ANOMALY_TYPES_MAX = 12
SUMMARY_EXAMPLE_CHARS_MAX = 300
SUMMARY_EXAMPLE_LINES_MAX = 4

RESULTS_LINE_CHARS_MAX = 100


@dataclass(frozen=True)
class Fault:
    """One fault interval, as the nemesis's history shows it."""

    kind: str  # "kill" | "pause" | "partition" | "restart" (or any other start-X/stop-X)
    target: str  # what was faulted, for a human: "shard-0 leader 10.213.1.2:7200"
    start_s: float  # seconds since the run began
    end_s: float | None  # None: never healed, it lasts till the end of the run

    def __post_init__(self) -> None:
        assert self.end_s is None or self.end_s >= self.start_s, self

    def as_map(self) -> dict[str, Any]:
        """The fault as ``results.edn`` holds it: ``{:kind :kill, :target "...", ...}``."""
        return {
            "kind": Keyword(self.kind),
            "target": self.target,
            "start-s": self.start_s,
            "end-s": self.end_s,
        }


# ---------------------------------------------------------------------------------------------
# Reading the history


def _is_client(op: Op) -> bool:
    return isinstance(op.process, int) and not isinstance(op.process, bool)


def _describe(value: Any) -> str:
    """A nemesis op's value as a line of text: a list of groups reads "us, eu|ap"."""
    if value is None:
        return ""
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, list | tuple | frozenset | set):
        items = sorted(value, key=str) if isinstance(value, set | frozenset) else value
        return ", ".join(_describe(item) for item in items)
    try:
        return dumps(value)
    except EdnError:
        return repr(value)


def _nemesis_actions(ops: Sequence[Op]) -> list[tuple[str, float, str]]:
    """Each nemesis action as (f, time it took effect in s, description).

    An op completes the pending one when it is an ``:info`` with the same ``f``; so both
    ``:invoke``/``:info`` pairs and Jepsen's own ``:info``/``:info`` pairs are read right, and
    a lone ``:info`` (a producer that writes only completions) still counts. An invocation
    that never completed is dropped: we cannot tell whether it took effect.
    """
    actions: list[tuple[str, float, str]] = []
    pending: Op | None = None

    def action(op: Op, description_from: Op | None = None) -> None:
        if op.time is None or op.f is None:
            return
        value = op.value
        if value is None and description_from is not None:
            value = description_from.value
        actions.append((str(op.f), op.time / NS_PER_S, _describe(value)))

    for op in ops:
        if op.process != NEMESIS:
            continue
        if pending is not None and op.type == "info" and op.f == pending.f:
            action(op, pending)
            pending = None
            continue
        if pending is not None and pending.type == "info":
            action(pending)
        pending = op if op.type in ("invoke", "info") else None
    if pending is not None and pending.type == "info":
        action(pending)
    return actions


def faults_from_history(ops: Sequence[Op]) -> list[Fault]:
    """The fault intervals of a history, ordered by start.

    ``stop-X`` heals the open ``X`` faults with the same description if there are any, and
    otherwise every open ``X`` fault (Jepsen's ``stop-kill`` restarts all killed nodes). A
    ``stop-X`` with nothing open is ignored. Any action not named ``start-``/``stop-`` is an
    instantaneous fault of that name (``restart``).
    """
    faults: list[Fault] = []
    open_faults: list[Fault] = []
    for f, time_s, target in _nemesis_actions(ops):
        if f.startswith("start-"):
            open_faults.append(Fault(f.removeprefix("start-"), target, time_s, None))
        elif f.startswith("stop-"):
            kind = f.removeprefix("stop-")
            same_kind = [fault for fault in open_faults if fault.kind == kind]
            healed = [fault for fault in same_kind if fault.target == target] or same_kind
            for fault in healed:
                open_faults.remove(fault)
                # Producers stamp times on several threads; a heal never precedes its fault.
                faults.append(dataclasses.replace(fault, end_s=max(time_s, fault.start_s)))
        else:
            faults.append(Fault(f, target, time_s, time_s))
    faults.extend(open_faults)
    faults.sort(key=lambda fault: fault.start_s)
    return faults


def _completed_pairs(ops: Sequence[Op]) -> list[tuple[Op, Op]]:
    """(invocation, completion) of every client op that completed, in completion order."""
    pairs: list[tuple[Op, Op]] = []
    invoked: dict[Any, Op] = {}
    for op in ops:
        if not _is_client(op):
            continue
        if op.type == "invoke":
            invoked[op.process] = op
        elif op.type in COMPLETION_TYPES:
            invocation = invoked.pop(op.process, None)
            if invocation is not None and invocation.time is not None and op.time is not None:
                pairs.append((invocation, op))
    return pairs


def _f_name(invocation: Op, completion: Op) -> str:
    f = completion.f if completion.f is not None else invocation.f
    return "" if f is None else str(f)


def latencies(ops: Sequence[Op]) -> list[tuple[float, float, str, str]]:
    """(invoke time s, latency s, completion type, f) of each completed client op.

    A completion belongs to the latest invocation of its process. ``:info`` completions
    count, with the time the client waited; an invocation never completed is left out.
    """
    return [
        (
            invocation.time / NS_PER_S,
            (completion.time - invocation.time) / NS_PER_S,
            str(completion.type),
            _f_name(invocation, completion),
        )
        for invocation, completion in _completed_pairs(ops)
        if invocation.time is not None and completion.time is not None
    ]


def _run_end_s(ops: Sequence[Op], faults: Sequence[Fault]) -> float:
    """The last moment the history or the faults mention (0.0 when they mention none)."""
    end_s = 0.0
    for op in ops:
        if op.time is not None:
            end_s = max(end_s, op.time / NS_PER_S)
    for fault in faults:
        end_s = max(end_s, fault.start_s if fault.end_s is None else fault.end_s)
    return end_s


# ---------------------------------------------------------------------------------------------
# results.edn

# An EDN symbol name (what may follow the colon of a keyword): no leading digit, and no
# digit right after a leading sign or dot; at most one namespace slash. Kept to ASCII
# constituents that every EDN reader we know of accepts.
_SYMBOL_PART = r"(?:[A-Za-z*!_?<>=&%$]|[-+.](?![0-9]))[A-Za-z0-9*!_?<>=&%$+.\-]*"
_KEYWORD_NAME = re.compile(rf"{_SYMBOL_PART}(?:/{_SYMBOL_PART})?")


def _edn_key(key: Any) -> Any:
    """A map key: a string that can be a keyword becomes one; others keep their type."""
    if isinstance(key, str) and not isinstance(key, Keyword | Symbol):
        return Keyword(key) if _KEYWORD_NAME.fullmatch(key) else str.__str__(key)
    return _hashable(_edn_form(key))


def _hashable(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_hashable(item) for item in value)
    if isinstance(value, dict):
        return tuple((key, _hashable(item)) for key, item in value.items())
    return value


def _edn_form(value: Any) -> Any:
    """`value` in the shapes `jepsen.edn.dumps` writes the way results.edn wants them."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, Keyword):
        if not _KEYWORD_NAME.fullmatch(value):
            raise EdnError(f"results: {value!r} cannot be written as an EDN keyword")
        return value
    if isinstance(value, Symbol | EdnList | Decimal | Tagged):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, numbers.Integral):  # numpy integers too
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, Mapping):
        return {_edn_key(key): _edn_form(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_edn_form(item) for item in value]
    if isinstance(value, set | frozenset):
        return frozenset(_hashable(_edn_form(item)) for item in value)
    if isinstance(value, Fault):
        return _edn_form(value.as_map())
    if isinstance(value, Op):
        # The op exactly as history.edn holds it, so it can be found there.
        return loads(format_op(value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {
            field.name.replace("_", "-"): getattr(value, field.name)
            for field in dataclasses.fields(value)
        }
        return _edn_form(fields)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise EdnError(f"results: no EDN form for {type(value).__name__}: {value!r}")


def _pretty(value: Any, indent: int, *, top: bool = False) -> str:
    """EDN text broken over lines where one line would be too long; the top map always is."""
    flat = dumps(value)
    if not isinstance(value, dict | list) or not value:
        return flat
    if not top and indent + len(flat) <= RESULTS_LINE_CHARS_MAX:
        return flat
    if isinstance(value, dict):
        entries = []
        for key, item in value.items():
            key_text = dumps(key)
            entries.append(f"{key_text} {_pretty(item, indent + 1 + len(key_text) + 1)}")
        return "{" + ("\n" + " " * (indent + 1)).join(entries) + "}"
    items = [_pretty(item, indent + 1) for item in value]
    return "[" + ("\n" + " " * (indent + 1)).join(items) + "]"


def write_results(path: Path, results: Mapping[str, Any]) -> None:
    """Write `results` as ``results.edn``, one top-level key per line.

    String keys become keywords (``"valid?"`` is written ``:valid?``), in nested maps too,
    unless they cannot be one (``"a b"``, ``"1"``), when they stay strings. String values
    stay strings; wrap one in `jepsen.edn.Keyword` to write a keyword. Lists and tuples are
    vectors, sets are sets, `Fault` and `Op` are maps, other dataclasses are maps of their
    fields (``start_s`` is written ``:start-s``), paths are strings. Raises `EdnError` for
    a value with no EDN form, before writing anything.
    """
    text = _pretty(_edn_form(results), 0, top=True) + "\n"
    Path(path).write_text(text, encoding="utf-8", newline="\n")


# ---------------------------------------------------------------------------------------------
# Plots


def _pyplot() -> Any:
    import matplotlib

    # Runs are headless; Agg draws PNGs without a display.
    matplotlib.use("Agg")
    from matplotlib import pyplot

    return pyplot


def _fault_colours(faults: Sequence[Fault]) -> dict[str, str]:
    colours: dict[str, str] = {}
    extra = 0
    for fault in faults:
        if fault.kind in colours:
            continue
        if fault.kind in FAULT_COLOURS:
            colours[fault.kind] = FAULT_COLOURS[fault.kind]
        else:
            colours[fault.kind] = FAULT_COLOURS_EXTRA[extra % len(FAULT_COLOURS_EXTRA)]
            extra += 1
    return colours


def _shade_faults(axes: Axes, faults: Sequence[Fault], end_s: float) -> list[Any]:
    """Shade each fault interval; returns one legend handle per kind of fault."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    colours = _fault_colours(faults)
    handles: dict[str, Any] = {}
    for fault in faults:
        colour = colours[fault.kind]
        if fault.end_s == fault.start_s:
            axes.axvline(fault.start_s, color=colour, linewidth=2, zorder=0)
            handles.setdefault(fault.kind, Line2D([], [], color=colour, linewidth=2))
        else:
            fault_end_s = end_s if fault.end_s is None else fault.end_s
            axes.axvspan(fault.start_s, fault_end_s, color=colour, alpha=0.45, zorder=0, lw=0)
            handles.setdefault(fault.kind, Patch(color=colour, alpha=0.45))
    for kind, handle in handles.items():
        handle.set_label(kind)
    return list(handles.values())


def _markers(fs: Sequence[str]) -> dict[str, str]:
    return {f: F_MARKERS[i % len(F_MARKERS)] for i, f in enumerate(sorted(set(fs)))}


def _finish(
    pyplot: Any, figure: Any, axes: Axes, handles: list[Any], title: str, path: Path
) -> None:
    axes.set_title(title)
    axes.grid(alpha=0.3)
    if handles:
        axes.legend(
            handles=handles,
            loc="upper left",
            bbox_to_anchor=(1.01, 1.0),
            fontsize="small",
            frameon=False,
        )
    try:
        figure.savefig(path, dpi=PLOT_DPI, bbox_inches="tight")
    finally:
        pyplot.close(figure)


def _no_operations(axes: Axes) -> None:
    axes.text(
        0.5, 0.5, "no completed operations", transform=axes.transAxes, ha="center", va="center"
    )


def plot_latency(ops: Sequence[Op], faults: Sequence[Fault], path: Path, title: str) -> None:
    """Write ``latency-raw.png``: each completed op's latency (ms, log) at its invocation.

    Colour says how the op completed (ok, fail, info), the marker says its ``f``; faults are
    shaded behind, one colour per kind.
    """
    pyplot = _pyplot()
    rows = latencies(ops)
    end_s = max(_run_end_s(ops, faults), 1.0)
    figure, axes = pyplot.subplots(figsize=PLOT_SIZE_INCHES)
    handles = _shade_faults(axes, faults, end_s)
    markers = _markers([f for *_, f in rows])
    series: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
    for invoke_s, latency_s, type_, f in rows:
        xs, ys = series.setdefault((f, type_), ([], []))
        xs.append(invoke_s)
        ys.append(max(latency_s * 1000.0, LATENCY_MS_MIN))
    for (f, type_), (xs, ys) in sorted(series.items(), key=_series_order):
        (line,) = axes.plot(
            xs,
            ys,
            linestyle="",
            marker=markers[f],
            markersize=3,
            alpha=0.7,
            color=PLOT_TYPE_COLOURS.get(type_, "#777777"),
            label=f"{f} {type_}",
            rasterized=True,
        )
        handles.append(line)
    axes.set_yscale("log")
    if not rows:
        axes.set_ylim(LATENCY_MS_MIN * 1000, 10_000)
        _no_operations(axes)
    axes.set_xlim(0, end_s)
    axes.set_xlabel("time (s)")
    axes.set_ylabel("latency (ms)")
    _finish(pyplot, figure, axes, handles, title, path)


def _series_order(item: tuple[tuple[str, str], Any]) -> tuple[str, int]:
    (f, type_), _ = item
    rank = COMPLETION_TYPES.index(type_) if type_ in COMPLETION_TYPES else len(COMPLETION_TYPES)
    return (f, rank)


def _rate_bucket_edges(end_s: float) -> list[float]:
    """Bucket edges from 0 to `end_s`, RATE_BUCKET_S apart.

    The run rarely ends on a whole bucket. A last partial bucket of at least half a bucket
    stands alone; a shorter one joins the bucket before it. Each bucket's rate divides by its
    own width, so the end of the run does not look like a collapse of throughput.
    """
    edges = [i * RATE_BUCKET_S for i in range(int(end_s // RATE_BUCKET_S) + 1)]
    if len(edges) == 1 or end_s - edges[-1] >= RATE_BUCKET_S / 2:
        edges.append(end_s)
    else:
        edges[-1] = end_s
    return edges


def plot_rate(ops: Sequence[Op], faults: Sequence[Fault], path: Path, title: str) -> None:
    """Write ``rate.png``: completions per second, one line per completion type and ``f``."""
    pyplot = _pyplot()
    end_s = max(_run_end_s(ops, faults), 1.0)
    edges = _rate_bucket_edges(end_s)
    buckets = len(edges) - 1
    counts: dict[tuple[str, str], list[int]] = {}
    for invocation, completion in _completed_pairs(ops):
        assert completion.time is not None
        bucket = min(int(completion.time / NS_PER_S / RATE_BUCKET_S), buckets - 1)
        series = counts.setdefault(
            (_f_name(invocation, completion), str(completion.type)), [0] * buckets
        )
        series[bucket] += 1
    figure, axes = pyplot.subplots(figsize=PLOT_SIZE_INCHES)
    handles = _shade_faults(axes, faults, end_s)
    markers = _markers([f for f, _ in counts])
    middles = [(edges[i] + edges[i + 1]) / 2 for i in range(buckets)]
    widths_s = [edges[i + 1] - edges[i] for i in range(buckets)]
    for (f, type_), series in sorted(counts.items(), key=_series_order):
        (line,) = axes.plot(
            middles,
            [count / width_s for count, width_s in zip(series, widths_s, strict=True)],
            marker=markers[f],
            markersize=3,
            linewidth=1,
            color=PLOT_TYPE_COLOURS.get(type_, "#777777"),
            label=f"{f} {type_}",
        )
        handles.append(line)
    if not counts:
        _no_operations(axes)
    axes.set_xlim(0, end_s)
    axes.set_ylim(bottom=0)
    axes.set_xlabel("time (s)")
    axes.set_ylabel("throughput (ops/s)")
    _finish(pyplot, figure, axes, handles, title, path)


# ---------------------------------------------------------------------------------------------
# timeline.html


def _value_text(value: Any) -> str:
    try:
        text = dumps(value)
    except EdnError:
        text = repr(value)
    if len(text) > TOOLTIP_VALUE_CHARS_MAX:
        text = text[: TOOLTIP_VALUE_CHARS_MAX - 1] + "…"
    return text


def _timeline_scale(pairs: Sequence[tuple[Op, Op]], end_s: float) -> float:
    """Pixels per second: the median op TIMELINE_MEDIAN_OP_PX tall, the page not too tall."""
    durations = sorted(
        (completion.time - invocation.time) / NS_PER_S
        for invocation, completion in pairs
        if invocation.time is not None and completion.time is not None
    )
    median_s = durations[len(durations) // 2] if durations else 0.0
    px_per_s = TIMELINE_MEDIAN_OP_PX / median_s if median_s > 0 else TIMELINE_HEIGHT_PX_MIN
    end_s = max(end_s, 1e-3)
    return min(max(px_per_s, TIMELINE_HEIGHT_PX_MIN / end_s), TIMELINE_HEIGHT_PX_MAX / end_s)


def _fault_lanes(faults: Sequence[Fault], end_s: float) -> list[int]:
    """A lane per fault so that overlapping faults sit side by side (first lane free)."""
    lane_ends: list[float] = []
    lanes = []
    for fault in faults:
        fault_end_s = end_s if fault.end_s is None else fault.end_s
        for lane, lane_end_s in enumerate(lane_ends):
            if lane_end_s < fault.start_s:
                lane_ends[lane] = fault_end_s
                lanes.append(lane)
                break
        else:
            lane_ends.append(fault_end_s)
            lanes.append(len(lane_ends) - 1)
    return lanes


def _process_order(process: Any) -> tuple[int, str]:
    return (process, "") if isinstance(process, int) else (1 << 62, str(process))


def write_timeline(ops: Sequence[Op], faults: Sequence[Fault], path: Path, title: str) -> None:
    """Write ``timeline.html``: a column per process, a box per completed op, time downwards.

    A box spans its op's invocation to its completion, coloured by how it completed; its
    tooltip gives ``f``, type, times and value. The nemesis's faults have the first column.
    Invocations that never completed get no box. The page is self-contained: no script, no
    network.
    """
    pairs = _completed_pairs(ops)
    end_s = max(_run_end_s(ops, faults), 1e-3)
    px_per_s = _timeline_scale(pairs, end_s)
    height_px = end_s * px_per_s + TIMELINE_BOX_PX_MIN
    lanes = _fault_lanes(faults, end_s)
    nemesis_px = TIMELINE_NEMESIS_LANE_PX * max(1, max(lanes, default=0) + 1)
    processes = sorted({invocation.process for invocation, _ in pairs}, key=_process_order)
    column_left = {
        process: TIMELINE_RULER_PX + nemesis_px + i * TIMELINE_COLUMN_PX
        for i, process in enumerate(processes)
    }
    width_px = TIMELINE_RULER_PX + nemesis_px + len(processes) * TIMELINE_COLUMN_PX

    parts = [
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title>\n<style>\n",
        "body{font:12px sans-serif;margin:0;padding:0 8px}\n",
        "h1{font-size:16px;margin:8px 0 4px}\n",
        "p{margin:0 0 8px}\n",
        f".head{{position:sticky;top:0;height:{TIMELINE_HEADER_PX}px;background:#fff;",
        "z-index:2;border-bottom:1px solid #ccc}\n",
        ".head div{position:absolute;top:3px;font-weight:bold;overflow:hidden;white-space:nowrap}\n",
        ".timeline{position:relative}\n",
        ".tick{position:absolute;left:0;border-top:1px solid #eee;color:#888;font-size:10px}\n",
        ".op,.fault{position:absolute;box-sizing:border-box;overflow:hidden;",
        "border:1px solid rgba(255,255,255,.6);border-radius:2px}\n",
        f".op{{width:{TIMELINE_COLUMN_PX - 4}px}}\n",
        ".fault{font-size:10px;padding:1px 2px;line-height:1.2;color:#333}\n",
    ]
    for type_, colour in TIMELINE_TYPE_COLOURS.items():
        parts.append(f".op.{type_}{{background:{colour}}}\n")
    fault_colours = _fault_colours(faults)
    fault_classes = {kind: f"k{i}" for i, kind in enumerate(fault_colours)}
    for kind, colour in fault_colours.items():
        parts.append(f".fault.{fault_classes[kind]}{{background:{colour}}}\n")
    parts.append("</style></head><body>\n")
    parts.append(f"<h1>{html.escape(title)}</h1>\n")
    parts.append(
        f"<p>{len(pairs)} completed operations, {len(faults)} faults, {end_s:.3f} s; "
        f"{px_per_s:.4g} px per second. Hover over a box for its operation.</p>\n"
    )

    parts.append(f'<div class="head" style="width:{width_px}px">')
    parts.append('<div style="left:0">time</div>')
    parts.append(f'<div style="left:{TIMELINE_RULER_PX}px">{NEMESIS}</div>')
    for process in processes:
        parts.append(
            f'<div style="left:{column_left[process]}px">{html.escape(str(process))}</div>'
        )
    parts.append("</div>\n")

    parts.append(f'<div class="timeline" style="width:{width_px}px;height:{height_px:.1f}px">\n')
    step_s = next(
        (step for step in TIMELINE_TICK_STEPS_S if step * px_per_s >= TIMELINE_TICK_PX_MIN),
        TIMELINE_TICK_STEPS_S[-1],
    )
    for tick in range(math.floor(end_s / step_s) + 1):
        tick_s = tick * step_s
        parts.append(
            f'<div class="tick" style="top:{tick_s * px_per_s:.1f}px;width:{width_px}px">'
            f"{tick_s:g} s</div>\n"
        )

    for fault, lane in zip(faults, lanes, strict=True):
        fault_end_s = end_s if fault.end_s is None else fault.end_s
        top_px = fault.start_s * px_per_s
        box_px = max((fault_end_s - fault.start_s) * px_per_s, TIMELINE_BOX_PX_MIN)
        until = "till the end of the run" if fault.end_s is None else f"to {fault.end_s:.3f} s"
        tooltip = f"{fault.kind} {fault.target}\nfrom {fault.start_s:.3f} s {until}"
        left_px = TIMELINE_RULER_PX + lane * TIMELINE_NEMESIS_LANE_PX
        parts.append(
            f'<div class="fault {fault_classes[fault.kind]}" style="left:{left_px}px;'
            f'top:{top_px:.1f}px;width:{TIMELINE_NEMESIS_LANE_PX - 4}px;height:{box_px:.1f}px"'
            f' title="{html.escape(tooltip)}">{html.escape(fault.kind)} '
            f"{html.escape(fault.target)}</div>\n"
        )

    for invocation, completion in pairs:
        assert invocation.time is not None and completion.time is not None
        invoke_s = invocation.time / NS_PER_S
        complete_s = completion.time / NS_PER_S
        type_ = str(completion.type)
        value = completion.value if completion.value is not None else invocation.value
        tooltip = (
            f"{_f_name(invocation, completion)} {type_} (process {invocation.process})\n"
            f"{invoke_s:.6f} s to {complete_s:.6f} s ({(complete_s - invoke_s) * 1000:.3f} ms)\n"
            f"{_value_text(value)}"
        )
        box_px = max((complete_s - invoke_s) * px_per_s, TIMELINE_BOX_PX_MIN)
        parts.append(
            f'<div class="op {html.escape(type_)}" style="left:{column_left[invocation.process]}px;'
            f'top:{invoke_s * px_per_s:.1f}px;height:{box_px:.1f}px" '
            f'title="{html.escape(tooltip)}"></div>\n'
        )
    parts.append("</div>\n</body></html>\n")
    Path(path).write_text("".join(parts), encoding="utf-8", newline="\n")


# ---------------------------------------------------------------------------------------------
# The summary printed at the end of a run


def _verdict(valid: Any) -> str:
    if valid is True:
        return "valid"
    if valid is False:
        return "INVALID"
    return "unknown"


def _overall_validity(results: Mapping[str, Any]) -> Any:
    if "valid?" in results:
        return results["valid?"]
    checkers = results.get("checkers")
    if isinstance(checkers, Mapping) and checkers:
        verdicts = [c.get("valid?") if isinstance(c, Mapping) else None for c in checkers.values()]
        if any(verdict is False for verdict in verdicts):
            return False
        if all(verdict is True for verdict in verdicts):
            return True
    return None


def _fault_fields(fault: Any) -> tuple[str, str, Any, Any]:
    if isinstance(fault, Fault):
        return fault.kind, fault.target, fault.start_s, fault.end_s
    if isinstance(fault, Mapping):
        return (
            str(fault.get("kind", "?")),
            str(fault.get("target", "")),
            fault.get("start-s"),
            fault.get("end-s"),
        )
    return "?", str(fault), None, None


def _example_text(example: Any) -> list[str]:
    if isinstance(example, Mapping):
        steps = example.get("steps")
        if isinstance(steps, list) and steps:
            lines = [
                str(step.get("explanation", step)) if isinstance(step, Mapping) else str(step)
                for step in steps
            ]
        elif "explanation" in example:
            lines = [str(example["explanation"])]
        else:
            lines = [_value_text_or_repr(example)]
    else:
        lines = [_value_text_or_repr(example)]
    shown = [
        line
        if len(line) <= SUMMARY_EXAMPLE_CHARS_MAX
        else line[: SUMMARY_EXAMPLE_CHARS_MAX - 1] + "…"
        for line in lines[:SUMMARY_EXAMPLE_LINES_MAX]
    ]
    if len(lines) > SUMMARY_EXAMPLE_LINES_MAX:
        shown.append(f"… {len(lines) - SUMMARY_EXAMPLE_LINES_MAX} more steps")
    return shown


def _value_text_or_repr(value: Any) -> str:
    try:
        return dumps(_edn_form(value))
    except EdnError:
        return repr(value)


def summary(results: Mapping[str, Any]) -> str:
    """The text printed when a run ends, from the dict given to `write_results`.

    Keys read, each optional:

    - ``"valid?"``: True, False, or anything else for unknown; when missing, the
      checkers' verdicts decide (any False: invalid; all True: valid);
    - ``"ops"``: ``{"ok": n, "fail": n, "info": n}``, and ``"invoke": n`` if the caller
      counted invocations (otherwise the total is ok + fail + info);
    - ``"nemesis"``: ``{"faults": [Fault or {"kind", "target", "start-s", "end-s"}],
      "counts": {kind: n}}`` (without counts, the faults are counted);
    - ``"anomaly-types"``: the anomaly types found (default: the keys of ``"anomalies"``);
    - ``"anomalies"``: ``{type: [example, ...]}``; an example's ``"steps"`` (each with an
      ``"explanation"``) or ``"explanation"`` is shown, else the example itself;
    - ``"anomaly-counts"``: ``{type: n}``, shown beside the type when present;
    - ``"checkers"``: ``{name: {"valid?": bool, ...}}``;
    - ``"dir"``: the run directory.
    """
    lines = [f"Result: {_verdict(_overall_validity(results))}"]

    ops = results.get("ops")
    if isinstance(ops, Mapping):
        ok, fail, info = (int(ops.get(type_, 0) or 0) for type_ in COMPLETION_TYPES)
        total = int(ops.get("invoke", 0) or 0) or ok + fail + info
        share = f"{100.0 * ok / total:.1f}%" if total else "n/a"
        lines.append(
            f"Operations: {total} invoked: {ok} ok, {fail} fail, {info} info; {share} completed ok"
        )

    nemesis = results.get("nemesis")
    if isinstance(nemesis, Mapping):
        faults = list(nemesis.get("faults") or [])
        counts = nemesis.get("counts")
        if not isinstance(counts, Mapping):
            counts = Counter(_fault_fields(fault)[0] for fault in faults)
        if counts:
            by_kind = ", ".join(f"{kind} {n}" for kind, n in sorted(counts.items()))
            lines.append(f"Faults: {by_kind}")
        else:
            lines.append("Faults: none")
        for fault in faults[:SUMMARY_FAULTS_MAX]:
            kind, target, start_s, end_s = _fault_fields(fault)
            start = f"{start_s:.1f} s" if isinstance(start_s, int | float) else "?"
            end = f"{end_s:.1f} s" if isinstance(end_s, int | float) else "the end"
            lines.append(f"  {kind:<10} {start} to {end}  {target}")
        if len(faults) > SUMMARY_FAULTS_MAX:
            lines.append(f"  … {len(faults) - SUMMARY_FAULTS_MAX} more")

    anomalies = results.get("anomalies")
    anomalies = anomalies if isinstance(anomalies, Mapping) else {}
    anomaly_types = list(results.get("anomaly-types") or anomalies.keys())
    anomaly_counts = results.get("anomaly-counts")
    anomaly_counts = anomaly_counts if isinstance(anomaly_counts, Mapping) else {}
    if anomaly_types:
        lines.append(f"Anomalies: {', '.join(str(kind) for kind in anomaly_types)}")
        for kind in anomaly_types[:SUMMARY_ANOMALY_TYPES_MAX]:
            count = f" ({anomaly_counts[kind]})" if kind in anomaly_counts else ""
            lines.append(f"  {kind}{count}")
            examples = anomalies.get(kind)
            if examples:
                first = examples[0] if isinstance(examples, list | tuple) else examples
                lines.extend(f"    {line}" for line in _example_text(first))
        if len(anomaly_types) > SUMMARY_ANOMALY_TYPES_MAX:
            lines.append(f"  … {len(anomaly_types) - SUMMARY_ANOMALY_TYPES_MAX} more types")

    checkers = results.get("checkers")
    if isinstance(checkers, Mapping) and checkers:
        lines.append("Checkers:")
        width = max(len(str(name)) for name in checkers)
        for name, result in checkers.items():
            valid = result.get("valid?") if isinstance(result, Mapping) else None
            lines.append(f"  {name!s:<{width}}  {_verdict(valid)}")

    if results.get("dir"):
        lines.append(f"Run directory: {results['dir']}")
    return "\n".join(lines)
