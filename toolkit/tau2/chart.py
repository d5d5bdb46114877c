"""The eval-tau2 chart: grouped bars (domains × pass^1..k, pass@k) drawn with matplotlib (Agg), an
optional dependency (`pip install -e '.[plot]'`; the dev extra has it too)."""

from __future__ import annotations

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
MISSING = "matplotlib is not installed (pip install -e '.[plot]')"


def chart_series(summary: dict) -> tuple[list[str], list[str], list[list[float | None]]]:
    """(domains, metrics, values[metric][domain]) of an eval-tau2 summary."""
    k = summary.get("k", 1)
    metrics = [f"pass^{j}" for j in range(1, k + 1)] + [f"pass@{k}"]
    doms = list(summary.get("domains", {}))
    vals = [[summary["domains"][d].get(m) for d in doms] for m in metrics]
    return doms, metrics, vals


def write_chart_png(summary: dict, path: str, title: str = "tau2-bench") -> bool:
    """Write the chart as PNG; False (nothing written) when matplotlib is missing (see MISSING)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    doms, metrics, vals = chart_series(summary)
    fig, ax = plt.subplots(figsize=(max(4, 1.6 * max(1, len(doms)) + 2), 3.6), dpi=100)
    width = 0.8 / max(1, len(metrics))
    for mi, (m, series) in enumerate(zip(metrics, vals)):
        xs = [di + (mi - (len(metrics) - 1) / 2) * width for di in range(len(doms))]
        ys = [100 * (v or 0.0) for v in series]
        ax.bar(xs, ys, width=width, label=m, color=PALETTE[mi % len(PALETTE)])
    ax.set_xticks(range(len(doms)))
    ax.set_xticklabels(doms)
    ax.set_ylim(0, 100)
    ax.set_ylabel("%")
    ax.set_title(title)
    ax.legend(fontsize=7, ncol=min(len(metrics), 5))
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True
