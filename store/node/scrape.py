"""Reading servers' metrics endpoints (store/node/metrics.py) from outside: what
``meridian status`` and the benchmarks use."""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from store.config import ClusterConfig, ReplicaNode


def metrics_url(config: ClusterConfig, node: ReplicaNode) -> str | None:
    listen = config.metrics_listen(node)
    if listen is None:
        return None
    return f"http://{listen[0]}:{listen[1]}/metrics"


def scrape(url: str, timeout_s: float = 5.0) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample of one endpoint: metric sample name -> [(labels, value), ...]. Raises
    OSError (urllib.error.URLError) if it does not answer."""
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        text = response.read().decode()
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return samples


def total(samples: dict[str, list[tuple[dict[str, str], float]]], name: str) -> float:
    return sum(value for _, value in samples.get(name, []))


def scrape_cluster(config: ClusterConfig, timeout_s: float = 5.0) -> dict[str, Any]:
    """Each process's samples, by its address (None for one that did not answer)."""
    found: dict[str, Any] = {}
    for node in config.nodes():
        url = metrics_url(config, node)
        if url is None:
            continue
        try:
            found[node.address] = scrape(url, timeout_s)
        except (OSError, urllib.error.URLError):
            found[node.address] = None
    return found
