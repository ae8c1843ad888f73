"""Plots the dashboard's panels from the series a real Prometheus answered.

    python3 packaging/grafana/plot.py DASHBOARD_DATA_JSON OUT_PNG

DASHBOARD_DATA_JSON is what the dashboard check writes (packaging/prometheus/check.sh --plot:
every query of every panel of packaging/grafana/nri-accel.json over the run, against
nri-accel inside real containerd). Grafana is not packaged for Debian, so the docs show this
plot of the same queries instead of a Grafana screenshot. Needs matplotlib (pip).
"""

import json
import math
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(data_path: str, out_path: str) -> None:
    with open(data_path) as f:
        panels = json.load(f)
    cols = 2
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(13, 2.6 * rows), squeeze=False)
    for ax, panel in zip(axes.flat, panels):
        for s in panel["series"]:
            if not s["points"]:
                continue
            xs = [p[0] for p in s["points"]]
            ys = [p[1] for p in s["points"]]
            ax.step(xs, ys, where="post", label=s["legend"] or "value", linewidth=1.4)
        unit = panel["unit"]
        ax.set_title(panel["title"], fontsize=10)
        ax.set_ylabel({"s": "seconds", "ops": "per second"}.get(unit, ""), fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if any(s["points"] for s in panel["series"]):
            ax.legend(fontsize=7, loc="upper left")
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("seconds into the run", fontsize=8)
    fig.suptitle(
        "nri-accel dashboard queries (packaging/grafana/nri-accel.json) answered by Prometheus "
        "scraping nri-accel in real containerd",
        fontsize=11,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    fig.savefig(out_path, dpi=80)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: plot.py DASHBOARD_DATA_JSON OUT_PNG")
    main(sys.argv[1], sys.argv[2])
