"""The report of one ``bench/peers/run.py`` invocation: report.json, report.md and PNG plots
(throughput as grouped bars, latency CDFs per round trip)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from bench.peers.common import RunResult

ORDER = ("meridian-commit", "meridian-certified", "postgres", "etcd")
LABELS = {
    "meridian-commit": "Meridian (waits for commit)",
    "meridian-certified": "Meridian (goes on at certification)",
    "postgres": "PostgreSQL (sync standby)",
    "etcd": "etcd (3 members)",
}
COLORS = {
    "meridian-commit": "#1f77b4",
    "meridian-certified": "#8fbbd9",
    "postgres": "#2ca02c",
    "etcd": "#d62728",
}


def rtt_key(rtt_ms: float) -> str:
    return f"{rtt_ms:g}"


def ratios(results: list[RunResult]) -> dict[str, dict[str, float | None]]:
    """Meridian's committed throughput over each peer's, at each round trip."""
    rates: dict[tuple[str, str], float] = {}
    for result in results:
        summary = result.summary()
        if result.status == "ok" and summary["txn_per_s"] > 0:
            rates[(result.system, rtt_key(result.rtt_ms))] = summary["txn_per_s"]
    out: dict[str, dict[str, float | None]] = {}
    for rtt in sorted({rtt_key(r.rtt_ms) for r in results}, key=float):
        entry: dict[str, float | None] = {}
        for mine, name in (("meridian-commit", "meridian_commit"), ("meridian-certified", "meridian_certified")):
            for peer in ("postgres", "etcd"):
                a, b = rates.get((mine, rtt)), rates.get((peer, rtt))
                entry[f"{name}_over_{peer}"] = round(a / b, 3) if a and b else None
        out[rtt] = entry
    return out


def build(
    results: list[RunResult], meta: dict[str, Any], systems: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    runs = [r.summary() for r in sorted(results, key=lambda r: (r.rtt_ms, _rank(r.system)))]
    certified = {
        rtt_key(r.rtt_ms): {
            k: r.extra.get(k) for k in ("certified", "committed_in_end", "not_committed")
        }
        for r in results if r.system == "meridian-certified" and r.status == "ok"
    }
    return {
        **meta,
        "systems": systems,
        "runs": runs,
        "ratios": ratios(results),
        "meridian_certified_commits": certified,
    }


def _rank(system: str) -> int:
    return ORDER.index(system) if system in ORDER else len(ORDER)


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _percent(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:.2f}%"


def markdown(report: dict[str, Any], plots: list[Path]) -> str:
    lines = [
        "# Meridian, PostgreSQL and etcd side by side",
        "",
        f"Run {report['generated']} on {report['machine']['cpus']} cores "
        f"(load average at start {report['machine']['loadavg_start']}): "
        f"`{report['command']}`",
        "",
        "Workload (the same for every system): "
        f"{report['workload']['keys']:,} preloaded keys; each transaction touches "
        f"{report['workload']['keys_per_txn']} distinct keys chosen uniformly; 50% read-only "
        "(read them), 50% read-modify-write (read them, write each +1); "
        f"{report['workload']['clients']} closed-loop clients; "
        f"{report['workload']['duration_s']:g} s per run. Only committed transactions count; "
        "aborts and serialization failures are retried until they commit, and counted.",
        "",
        f"Wide-area delay: {report['wan']['how']}",
        "",
        *[f"Meridian: {cluster}; every other system keeps all keys on one primary or group.\n"
          for cluster in sorted({run["cluster"] for run in report["runs"]
                                 if run["system"].startswith("meridian") and run.get("cluster")})],
        "| system | RTT ms | committed txn/s | p50 ms | p99 ms | retries | errors | what is not measured |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for run in report["runs"]:
        label = LABELS.get(run["system"], run["system"])
        if run["status"] != "ok":
            lines.append(
                f"| {label} | {run['rtt_ms']:g} | **{run['status']}** | | | | | {run.get('reason', '')} |"
            )
            continue
        lines.append(
            f"| {label} | {run['rtt_ms']:g} | {_fmt(run['txn_per_s'])} | {_fmt(run['p50_ms'])} "
            f"| {_fmt(run['p99_ms'])} | {_fmt(run['retries'])} | {_fmt(run['errors'])} "
            f"| {run['not_measured']} |"
        )
    lines += ["", "Latency: from submission until the committed answer, retries included; for "
              "Meridian going on at certification, until the certified answer (its commit "
              "latency is below).", ""]
    by_kind = [
        "| system | RTT ms | read-only p50 / p99 / mean ms | read-only at 10 ms or more "
        "| read-modify-write p50 / p99 / mean ms | driver CPU (s per s) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for run in report["runs"]:
        if run["status"] != "ok":
            continue
        ro, rmw = run["by_kind"]["read_only"], run["by_kind"]["rmw"]
        by_kind.append(
            f"| {LABELS.get(run['system'], run['system'])} | {run['rtt_ms']:g} "
            f"| {_fmt(ro['p50_ms'])} / {_fmt(ro['p99_ms'])} / {_fmt(ro.get('mean_ms'))} "
            f"| {_percent(ro.get('over_10ms_share'))} "
            f"| {_fmt(rmw['p50_ms'])} / {_fmt(rmw['p99_ms'])} / {_fmt(rmw.get('mean_ms'))} "
            f"| {_fmt(run.get('driver_cpu_share'), 2)} |"
        )
    if len(by_kind) > 2:
        lines += ["## By kind", "", *by_kind, ""]
    lines += ["## Ratios (committed txn/s)", "", "| RTT ms | " + " | ".join(
        k for k in next(iter(report["ratios"].values()), {})) + " |"]
    if report["ratios"]:
        keys = list(next(iter(report["ratios"].values())))
        lines.append("|---:|" + "---:|" * len(keys))
        for rtt, entry in report["ratios"].items():
            lines.append(f"| {rtt} | " + " | ".join(_fmt(entry[k], 3) for k in keys) + " |")
    lines.append("")
    breakdowns = [
        (run["rtt_ms"], {**run["rmw_breakdown"], **{
            k: run.get(k) for k in ("stream_batch_wait_mean_ms", "stream_choose_mean_ms")
        }})
        for run in report["runs"]
        if run["system"] == "meridian-commit" and run.get("rmw_breakdown")
    ]
    if breakdowns:
        lines += [
            "## Meridian waiting for commit: where a read-modify-write's time goes", "",
            "From submission to the certified answer (execution and two-phase commit between "
            "the shard leaders), then from there to the commit (the stream's batch, the round "
            "trip to the nearest other region, the watermarks), of each committed "
            "read-modify-write's last attempt. Of the commit wait, the leaders' streams "
            "measure two parts (means over every batch): a batch's wait from its first record "
            "to its close, and an entry's round to a majority of regions.", "",
            "| RTT ms | certified p50 / mean ms | commit wait p10 / p50 / p90 / mean ms "
            "| stream batch wait mean ms | stream round mean ms |",
            "|---:|---:|---:|---:|---:|",
        ]
        for rtt, b in breakdowns:
            lines.append(
                f"| {rtt:g} | {_fmt(b['certified_p50_ms'])} / {_fmt(b['certified_mean_ms'])} "
                f"| {_fmt(b['commit_wait_p10_ms'])} / {_fmt(b['commit_wait_p50_ms'])} / "
                f"{_fmt(b['commit_wait_p90_ms'])} / {_fmt(b['commit_wait_mean_ms'])} "
                f"| {_fmt(b['stream_batch_wait_mean_ms'])} | {_fmt(b['stream_choose_mean_ms'])} |"
            )
        lines.append("")
    cpu = [(run["system"], run["rtt_ms"], run["cpu_share"]) for run in report["runs"]
           if run.get("cpu_share")]
    if cpu:
        roles = ("leaders", "followers", "cm", "wan_proxy")
        lines += [
            "## Meridian: where the machine's CPU went", "",
            "Cores busy per second of each phase, summed over the cluster's processes of a role "
            "(the driver's own is `driver CPU` above), the whole machine's busy fraction "
            "(1.0: every core busy; PostgreSQL's and etcd's runs are not metered this way), and "
            "the fraction the host stole (a virtual CPU ready to run while the host ran "
            "something else: on a shared host it comes and goes, and every figure with it).", "",
            "| run | RTT ms | " + " | ".join(roles) + " | machine busy | stolen |",
            "|---|---:|" + "---:|" * (len(roles) + 2),
        ]
        for system, rtt, shares in cpu:
            lines.append(
                f"| {LABELS.get(system, system)} | {rtt:g} | "
                + " | ".join(_fmt(shares.get(role), 2) for role in roles)
                + f" | {_fmt(shares.get('machine_busy'), 2)} | {_fmt(shares.get('machine_steal'), 3)} |"
            )
        lines.append("")
    certified = report["meridian_certified_commits"]
    if certified:
        lines += ["## Meridian going on at certification: did every transaction commit?", ""]
        for rtt, entry in certified.items():
            run = next(r for r in report["runs"]
                       if r["system"] == "meridian-certified" and f"{r['rtt_ms']:g}" == rtt)
            verdict = "yes" if entry["not_committed"] == 0 else "**NO**"
            lines.append(
                f"- RTT {rtt} ms: {verdict}: {_fmt(entry['certified'])} certified, "
                f"{_fmt(entry['committed_in_end'])} committed in the end, "
                f"{_fmt(entry['not_committed'])} not committed; commit latency p50 "
                f"{_fmt(run.get('commit_p50_ms'))} ms, p99 {_fmt(run.get('commit_p99_ms'))} ms; "
                f"requests per committed transaction: {_fmt(run.get('submits_per_txn'), 3)} "
                f"SUBMIT, {_fmt(run.get('await_requests_per_txn'), 3)} AWAIT (commits awaited "
                "together)."
            )
        lines.append("")
    lines += ["## Systems", ""]
    for name, info in report["systems"].items():
        status = info["status"]
        text = f"- **{name}**: {status}"
        if info.get("reason"):
            text += f" — {info['reason']}"
        details = [f"{k}: {v}" for k, v in info.items() if k not in ("status", "reason")]
        if details:
            text += "; " + "; ".join(details)
        lines.append(text)
    lines += ["", "Everything (servers, wan-proxy processes, clients) shares this machine's "
              "cores; at 0 ms the figures are bounded by CPU, not by the network. `driver CPU` "
              "is the client process's CPU seconds per second of run (1.0 = one core busy).", ""]
    if plots:
        lines += ["## Plots", ""]
        lines += [f"![{p.stem}]({p.name})" for p in plots]
        lines.append("")
    return "\n".join(lines)


def plot(results: list[RunResult], out_dir: Path) -> list[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot
    except ImportError:
        print("peers: matplotlib is not installed; no plots", file=sys.stderr)
        return []
    ok = [r for r in results if r.status == "ok"]
    if not ok:
        return []
    paths = []
    rtts = sorted({r.rtt_ms for r in results})
    systems = [s for s in ORDER if any(r.system == s for r in ok)]
    figure, axes = pyplot.subplots(figsize=(8, 4.5))
    width = 0.8 / max(len(systems), 1)
    for i, system in enumerate(systems):
        xs, heights = [], []
        for j, rtt in enumerate(rtts):
            match = [r for r in ok if r.system == system and r.rtt_ms == rtt]
            if match:
                xs.append(j + (i - (len(systems) - 1) / 2) * width)
                heights.append(match[0].summary()["txn_per_s"])
        bars = axes.bar(xs, heights, width, label=LABELS[system], color=COLORS[system])
        axes.bar_label(bars, fmt="%.0f", fontsize=8)
    axes.set_xticks(range(len(rtts)), [f"RTT {r:g} ms" for r in rtts])
    axes.set_ylabel("committed transactions per second")
    axes.set_title("Throughput: the same workload on each system")
    axes.legend(fontsize=8)
    axes.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    path = out_dir / "throughput.png"
    figure.savefig(path, dpi=100)
    pyplot.close(figure)
    paths.append(path)
    for rtt in rtts:
        at = [r for r in ok if r.rtt_ms == rtt]
        if not at:
            continue
        figure, axes = pyplot.subplots(figsize=(8, 4.5))
        for result in sorted(at, key=lambda r: _rank(r.system)):
            values = sorted(x * 1000 for x in result.all_latencies())
            if not values:
                continue
            xs, ys = cdf_points(values)
            axes.step(xs, ys, where="post", label=LABELS[result.system],
                      color=COLORS[result.system])
        axes.set_xscale("log")
        axes.set_xlabel("latency (ms, log scale)")
        axes.set_ylabel("fraction of committed transactions")
        axes.set_title(f"Latency CDF at RTT {rtt:g} ms (Meridian at certification: certified latency)")
        axes.set_ylim(0, 1.0)
        axes.grid(alpha=0.3, which="both")
        axes.legend(fontsize=8, loc="lower right")
        figure.tight_layout()
        path = out_dir / f"latency-cdf-rtt{rtt:g}.png"
        figure.savefig(path, dpi=100)
        pyplot.close(figure)
        paths.append(path)
    return paths


def cdf_points(ordered: list[float], points: int = 2000) -> tuple[list[float], list[float]]:
    """At most ``points`` steps of the empirical CDF of ``ordered`` (sorted), the last one
    the maximum."""
    n = len(ordered)
    ranks = sorted({max(1, round(n * (i + 1) / points)) for i in range(min(points, n))})
    return [ordered[r - 1] for r in ranks], [r / n for r in ranks]


def write(
    results: list[RunResult], meta: dict[str, Any], systems: dict[str, dict[str, Any]],
    out_dir: Path,
) -> dict[str, Any]:
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = plot(results, out_dir)
    report = build(results, meta, systems)
    report["report_dir"] = str(out_dir)
    report["files"] = ["report.md", "report.json", *(p.name for p in plots)]
    (out_dir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out_dir / "report.md").write_text(markdown(report, plots))
    return report
