"""The run's throughput-per-second plot (a PNG in the run directory), and its data as CSV.

matplotlib is optional: without it the CSV is still written and the plot is skipped with a
message, so a machine without it can still run the benchmark.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def write_throughput(report: dict[str, Any], run_dir: Path, title: str) -> Path | None:
    """Writes throughput.csv and, if matplotlib is installed, throughput.png; returns the PNG."""
    run_dir.mkdir(parents=True, exist_ok=True)
    series = report["throughput_per_s"]
    csv_path = run_dir / "throughput.csv"
    csv_path.write_text("second,transactions\n" + "".join(f"{s},{n}\n" for s, n in enumerate(series)))
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot
    except ImportError:
        print(
            f"tpcc: matplotlib is not installed; skipping the plot (data in {csv_path})",
            file=sys.stderr,
        )
        return None
    figure, axes = pyplot.subplots(figsize=(8, 4))
    # One flat step per whole second of the run: second s covers [s, s + 1).
    axes.stairs(series, range(len(series) + 1), linewidth=1.5)
    axes.set_xlabel("second of the run")
    axes.set_ylabel("transactions committed per second")
    axes.set_title(title)
    axes.set_ylim(bottom=0)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    png_path = run_dir / "throughput.png"
    figure.savefig(png_path, dpi=100)
    pyplot.close(figure)
    return png_path
