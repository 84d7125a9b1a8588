#!/usr/bin/env python3
"""The soak's timeline as a PNG: requests/s, hit rate, host RSS and the pool's bytes over time,
with the faults marked.

    python3 bench/soak_plot.py bench/soak_report.json bench/soak_report.png

Needs matplotlib (Debian: python3-matplotlib; `HSS_BOOTSTRAP_PLOT=1 scripts/bootstrap`).
"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

FAULT_COLORS = {"redis_restart": "tab:red", "reset": "tab:purple", "storm": "tab:orange",
                "producer_restart": "tab:brown"}


def rates(timeline):
    """Requests completed per second between consecutive samples."""
    out = []
    for before, after in zip(timeline, timeline[1:]):
        seconds = after["t"] - before["t"]
        out.append((after["t"], (after["completed"] - before["completed"]) / seconds
                    if seconds > 0 else 0.0))
    return out


def main(report_path, png_path):
    with open(report_path, encoding="utf-8") as f:
        report = json.load(f)
    timeline = report["timeline"]
    t = [s["t"] for s in timeline]
    fig, axes = plt.subplots(4, 1, figsize=(10, 11), sharex=True)
    rate = rates(timeline)
    axes[0].plot([x for x, _ in rate], [y for _, y in rate], color="tab:blue")
    axes[0].set_ylabel("requests / s")
    hits = [(s["t"], s["hit_rate_10s"]) for s in timeline if s.get("hit_rate_10s") is not None]
    axes[1].plot([x for x, _ in hits], [y for _, y in hits], color="tab:green")
    axes[1].set_ylabel("requests with rows\nrestored (last 10 s)")
    axes[1].set_ylim(0, 1)
    axes[2].plot(t, [s["rss_mib"] for s in timeline], label="all server processes")
    if "rss_engine_mib" in timeline[0]:
        axes[2].plot(t, [s["rss_engine_mib"] for s in timeline], label="engine core and its worker")
        axes[2].plot(t, [s["rss_api_mib"] for s in timeline], label="API server")
    if any(s.get("rss_producer_mib") for s in timeline):  # --pd
        axes[2].plot(t, [s["rss_producer_mib"] for s in timeline], ":",
                     label="P/D producer (restarted)")
    axes[2].set_ylabel("host RSS (MiB)")
    axes[2].legend(loc="center right", fontsize="small")
    axes[3].plot(t, [s["pool_bytes"] / 2**20 for s in timeline], label="held")
    axes[3].plot(t, [s["pool_capacity"] / 2**20 for s in timeline], "--", label="capacity")
    axes[3].set_ylabel("hidden-state pool (MiB)")
    axes[3].set_xlabel("seconds")
    axes[3].legend(loc="lower right", fontsize="small")
    for event in report.get("fault_log", []):
        for ax in axes:
            ax.axvline(event["t"], color=FAULT_COLORS.get(event["kind"], "grey"), alpha=0.4,
                       linewidth=1)
    kinds = {event["kind"] for event in report.get("fault_log", [])} or set(FAULT_COLORS)
    handles = [plt.Line2D([], [], color=c, alpha=0.6, label=k) for k, c in FAULT_COLORS.items()
               if k in kinds]
    axes[0].legend(handles=handles, loc="lower right", fontsize="small", title="faults")
    requests = report["requests"]
    pd = " (P/D)" if report.get("config", {}).get("pd") else ""
    fig.suptitle(f"hsstore soak{pd}: {requests['completed']} requests in {report['seconds']:.0f} s, "
                 f"{report['mismatches']} mismatches, "
                 f"RSS growth {report['memory'].get('rss_growth_mib', '?')} MiB after warm-up "
                 f"({'passed' if report['passed'] else 'FAILED'})", fontsize=10)
    fig.tight_layout()
    fig.savefig(png_path, dpi=90)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
