"""Which consistency models a set of anomalies rules out.

This follows Elle's model hierarchy (jepsen-io/elle, ``src/elle/consistency_model.clj``,
which cites Adya's thesis, Bailis et al.'s "Highly Available Transactions", Cerone et al.,
Daudjee and Salem, and Hermitage). Three relations make it up:

- ``IMPLIED_ANOMALIES``: seeing anomaly A means B is present as well (a G0 cycle is also a
  G1c cycle; an anomaly without realtime edges is also one of its ``-realtime`` variants);
- ``MODEL_IMPLIES``: a history that satisfies model M also satisfies the models listed
  (strict serializable implies serializable implies repeatable read...);
- ``PROSCRIBED``: the anomalies each model forbids directly, beyond those its weaker models
  forbid.

A model is impossible when it, or a weaker model it implies, proscribes an anomaly implied by
what we saw. ``boundary`` returns the weakest impossible models (``not``), which is the useful
statement: "this history is not even read committed", and the rest (``also_not``).

Our cycle anomalies ``G-single`` and ``G2-item`` are built from per-key (item)
anti-dependencies, never predicate ones, so they are Elle's ``G-single-item`` and
``G2-item``; we map the names before consulting the hierarchy.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "anomalies_prohibited_by",
    "boundary",
    "implies",
    "impossible_models",
]

# Our anomaly name -> Elle's name, where they differ.
_ELLE_NAME = {
    "G-single": "G-single-item",
    "G-single-process": "G-single-item-process",
    "G-single-realtime": "G-single-item-realtime",
}

IMPLIED_ANOMALIES: dict[str, tuple[str, ...]] = {
    "G0": ("G1c", "G0-process"),
    "G0-process": ("G1c-process", "G0-realtime"),
    "G0-realtime": ("G1c-realtime",),
    "G1a": ("G1",),
    "G1b": ("G1",),
    "G1c": ("G1", "G1c-process"),
    "G1c-process": ("G1c-realtime", "G1-process"),
    "G1c-realtime": ("G1-realtime",),
    "G1": ("G1-process",),
    "G1-process": ("G1-realtime",),
    "G-single-item": ("G-single", "G-single-item-process", "G-nonadjacent-item"),
    "G-single-item-process": (
        "G-single-process",
        "G-single-item-realtime",
        "G-nonadjacent-item-process",
    ),
    "G-single-item-realtime": ("G-single-realtime", "G-nonadjacent-item-realtime"),
    "G-single": ("G-nonadjacent", "GSIb", "G-single-process"),
    "G-single-process": ("G-nonadjacent-process", "G-single-realtime"),
    "G-single-realtime": ("G-nonadjacent-realtime",),
    "G-nonadjacent-item": ("G-nonadjacent", "G2-item", "G-nonadjacent-item-process"),
    "G-nonadjacent-item-process": (
        "G-nonadjacent-process",
        "G2-item-process",
        "G-nonadjacent-item-realtime",
    ),
    "G-nonadjacent-item-realtime": ("G2-item-realtime", "G-nonadjacent-realtime"),
    "G-nonadjacent": ("G2", "G-nonadjacent-process"),
    "G-nonadjacent-process": ("G2-process", "G-nonadjacent-realtime"),
    "G-nonadjacent-realtime": ("G2-realtime",),
    "G2": ("G2-process",),
    "G2-item": ("G2", "G2-item-process"),
    "G2-item-process": ("G2-process", "G2-item-realtime"),
    "G2-item-realtime": ("G2-realtime",),
    "G2-process": ("G2-realtime",),
    "GSIa": ("GSI",),
    "GSIb": ("GSI",),
    # Two committed reads that no single order of appends explains: a dirty read.
    "incompatible-order": ("G1a",),
    # A read of the transaction's own later write is a trivial wr cycle.
    "future-read": ("G1c",),
    "dirty-update": ("G1a",),
    # Lost update is a special case of write skew, and of G2-item (one key).
    "lost-update": ("write-skew", "G2-item"),
    "write-skew": ("G2",),
}

# Canonical names (Adya's PL levels) for models known by several names.
_CANONICAL = {
    "consistent-view": "PL-2+",
    "conflict-serializable": "PL-3",
    "cursor-stability": "PL-CS",
    "forward-consistent-view": "PL-FCV",
    "monotonic-snapshot-read": "PL-MSR",
    "monotonic-view": "PL-2L",
    "read-committed": "PL-2",
    "read-uncommitted": "PL-1",
    "repeatable-read": "PL-2.99",
    "serializable": "PL-3",
    "snapshot-isolation": "PL-SI",
    "strict-serializable": "PL-SS",
    "strong-serializable": "PL-SS",
    "update-serializable": "PL-3U",
    "strong-session-read-uncommitted": "strong-session-PL-1",
    "strong-session-read-committed": "strong-session-PL-2",
    "strong-read-uncommitted": "strong-PL-1",
    "strong-read-committed": "strong-PL-2",
}
_FRIENDLY = {canonical: friendly for friendly, canonical in _CANONICAL.items()}
_FRIENDLY["PL-3"] = "serializable"
_FRIENDLY["PL-SS"] = "strict-serializable"

# If a history satisfies the key, it satisfies each model listed (friendly names).
_MODEL_IMPLIES_FRIENDLY: dict[str, tuple[str, ...]] = {
    "causal-cerone": ("read-atomic",),
    "consistent-view": ("cursor-stability", "monotonic-view"),
    "conflict-serializable": ("view-serializable",),
    "cursor-stability": ("read-committed", "PL-2"),
    "forward-consistent-view": ("consistent-view",),
    "PL-2": ("PL-1",),
    "PL-3": ("repeatable-read", "update-serializable"),
    "update-serializable": ("forward-consistent-view",),
    "monotonic-atomic-view": ("read-committed",),
    "monotonic-view": ("PL-2",),
    "monotonic-snapshot-read": ("PL-2",),
    "parallel-snapshot-isolation": ("causal-cerone", "update-atomic"),
    "prefix": ("causal-cerone",),
    "read-atomic": ("monotonic-atomic-view",),
    "read-committed": ("read-uncommitted",),
    "repeatable-read": ("cursor-stability", "monotonic-atomic-view"),
    "update-atomic": ("read-atomic",),
    "serializable": ("repeatable-read", "snapshot-isolation", "view-serializable"),
    "session-serializable": ("1SR",),
    "snapshot-isolation": (
        "forward-consistent-view",
        "monotonic-atomic-view",
        "monotonic-snapshot-read",
        "parallel-snapshot-isolation",
        "prefix",
    ),
    "strict-serializable": (
        "PL-3",
        "serializable",
        "linearizable",
        "snapshot-isolation",
        "strong-snapshot-isolation",
        "strong-session-serializable",
    ),
    "strong-session-PL-1": ("PL-1",),
    "strong-session-PL-2": ("PL-2", "strong-session-PL-1"),
    "strong-PL-1": ("strong-session-PL-1",),
    "strong-PL-2": ("strong-session-PL-2", "strong-PL-1"),
    "strong-session-serializable": ("serializable", "strong-session-snapshot-isolation"),
    "strong-session-snapshot-isolation": ("snapshot-isolation", "strong-session-PL-2"),
    "strong-serializable": ("session-serializable",),
    "strong-snapshot-isolation": ("strong-session-snapshot-isolation", "strong-PL-2"),
    "linearizable": ("sequential",),
    "sequential": ("causal",),
    "causal": ("writes-follow-reads", "PRAM"),
    "PRAM": ("monotonic-reads", "monotonic-writes", "read-your-writes"),
}

# Anomalies each model forbids directly (friendly names). Cycle-existence pseudo-anomalies
# of Elle are left out: we always name the cycle we found.
_PROSCRIBED_FRIENDLY: dict[str, tuple[str, ...]] = {
    "causal-cerone": ("internal", "G1a"),
    "cursor-stability": ("G1", "G-cursor", "lost-update"),
    "monotonic-view": ("G1", "G-monotonic"),
    "monotonic-snapshot-read": ("G1", "G-MSR"),
    "consistent-view": ("G1", "G-single"),
    "forward-consistent-view": ("G1", "G-SIb"),
    "parallel-snapshot-isolation": ("internal", "G1a"),
    "PL-3": ("G1", "G2", "predicate-read-miss"),
    "PL-2": ("G1",),
    "PL-1": ("G0", "duplicate-elements", "cyclic-versions"),
    "prefix": ("internal", "G1a"),
    "serializable": ("internal",),
    "snapshot-isolation": ("internal", "G1", "G-SI", "G-nonadjacent"),
    "read-atomic": ("internal", "G1a", "future-read"),
    "repeatable-read": ("G1", "G2-item", "lost-update"),
    "update-atomic": ("lost-update",),
    "strict-serializable": ("G1", "G1c-realtime", "G2-realtime"),
    "strong-session-PL-1": ("G0-process",),
    "strong-session-PL-2": ("G1c-process",),
    "strong-PL-1": ("G0-realtime",),
    "strong-PL-2": ("G1c-realtime",),
    "strong-session-snapshot-isolation": ("internal", "G1-process", "G-nonadjacent-process"),
    "strong-snapshot-isolation": ("internal", "G1-realtime", "G-nonadjacent-realtime"),
    "strong-session-serializable": ("G1-process", "G2-process"),
    "update-serializable": ("G1", "G-update"),
}


def canonical(model: str) -> str:
    return _CANONICAL.get(model, model)


def friendly(model: str) -> str:
    return _FRIENDLY.get(model, model)


def _canonical_graph(graph: dict[str, tuple[str, ...]]) -> dict[str, set[str]]:
    result: dict[str, set[str]] = {}
    for key, values in graph.items():
        result.setdefault(canonical(key), set()).update(canonical(v) for v in values)
    return result


MODEL_IMPLIES = _canonical_graph(_MODEL_IMPLIES_FRIENDLY)
PROSCRIBED: dict[str, set[str]] = {}
for _model, _anomalies in _PROSCRIBED_FRIENDLY.items():
    PROSCRIBED.setdefault(canonical(_model), set()).update(_anomalies)

_MODEL_IMPLIED_BY: dict[str, set[str]] = {}
for _model, _weaker in MODEL_IMPLIES.items():
    for _w in _weaker:
        _MODEL_IMPLIED_BY.setdefault(_w, set()).add(_model)
_ANOMALY_IMPLIED_BY: dict[str, set[str]] = {}
for _anomaly, _implied in IMPLIED_ANOMALIES.items():
    for _i in _implied:
        _ANOMALY_IMPLIED_BY.setdefault(_i, set()).add(_anomaly)
_MODELS_PROSCRIBING: dict[str, set[str]] = {}
for _model, _anomalies_set in PROSCRIBED.items():
    for _a in _anomalies_set:
        _MODELS_PROSCRIBING.setdefault(_a, set()).add(_model)


def _closure(
    start: Iterable[str], edges: dict[str, set[str]] | dict[str, tuple[str, ...]]
) -> set[str]:
    seen = set(start)
    frontier = list(seen)
    while frontier:
        node = frontier.pop()
        for successor in edges.get(node, ()):
            if successor not in seen:
                seen.add(successor)
                frontier.append(successor)
    return seen


def _elle_names(anomalies: Iterable[str]) -> set[str]:
    return {_ELLE_NAME.get(anomaly, anomaly) for anomaly in anomalies}


def impossible_models(anomalies: Iterable[str]) -> set[str]:
    """All models (canonical names) that cannot hold given `anomalies`."""
    implied = _closure(_elle_names(anomalies), IMPLIED_ANOMALIES)
    direct = {model for anomaly in implied for model in _MODELS_PROSCRIBING.get(anomaly, ())}
    # A model is impossible if any model it implies is impossible.
    return _closure(direct, _MODEL_IMPLIED_BY)


def boundary(anomalies: Iterable[str]) -> tuple[list[str], list[str]]:
    """(``not``, ``also_not``): the weakest impossible models and the other impossible ones.

    Friendly names (``serializable`` rather than ``PL-3``), each list sorted.
    """
    impossible = impossible_models(anomalies)
    weakest = {
        model
        for model in impossible
        if not (_closure([model], MODEL_IMPLIES) - {model}) & impossible
    }
    not_models = sorted({friendly(m) for m in weakest})
    also_not = sorted({friendly(m) for m in impossible - weakest} - set(not_models))
    return not_models, also_not


def anomalies_prohibited_by(models: Iterable[str]) -> set[str]:
    """Every anomaly (ours and Elle's names) that must be absent if all `models` hold."""
    implied_models = _closure((canonical(m) for m in models), MODEL_IMPLIES)
    direct = {anomaly for model in implied_models for anomaly in PROSCRIBED.get(model, ())}
    prohibited = _closure(direct, _ANOMALY_IMPLIED_BY)
    prohibited |= {ours for ours, elle in _ELLE_NAME.items() if elle in prohibited}
    return prohibited


def implies(anomaly: str, other: str) -> bool:
    """Whether finding `anomaly` means `other` is present too (reflexive)."""
    return _ELLE_NAME.get(other, other) in _closure(_elle_names([anomaly]), IMPLIED_ANOMALIES)
