#!/usr/bin/env python3
"""Charts for docs/perf.md from `hss-bench --json FILE`.

    python3 bench/plot.py BENCH.json OUTDIR

Writes into OUTDIR:
  throughput_vs_prefix.png   store / retrieve GB/s against prefix length (hidden_dim 4096)
  throughput_vs_hidden.png   store / retrieve GB/s against hidden_dim (16K-token prefix)
  ratio_to_memcpy.png        every figure's ratio to memcpy measured in the same run
  ratio_to_naive.png         every figure held against the naive store
Needs matplotlib (Debian: python3-matplotlib).
"""

import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def matching(figures, workload, name, fixed):
    """The figures of one case whose parameters include `fixed`."""
    for f in figures:
        if f["workload"] == workload and f["name"] == name and all(
            f["params"].get(k) == v for k, v in fixed.items()
        ):
            yield f


def series(figures, workload, name, vary, fixed):
    """(x, GB/s, p25 GB/s, p75 GB/s) of one case along parameter `vary`."""
    points = []
    for f in matching(figures, workload, name, fixed):
        p = f["params"]
        s = f["seconds"]
        rate = lambda t: f["bytes"] / t / 1e9 if t else 0.0  # noqa: E731
        # Slower reps (p75 of the time) give the lower rate.
        points.append((p[vary], rate(s["median"]), rate(s["p75"]), rate(s["p25"])))
    points.sort()
    return points


def ref_rate(figures, workload, name, vary, fixed, ref):
    points = []
    for f in matching(figures, workload, name, fixed):
        p = f["params"]
        for r in f["refs"]:
            if r["name"] == ref and r["seconds"]["median"]:
                points.append((p[vary], r["bytes"] / r["seconds"]["median"] / 1e9))
    points.sort()
    return points


def line_chart(data, vary, fixed, title, xlabel, out, log_x):
    figures = data["figures"]
    fig, ax = plt.subplots(figsize=(8, 5))
    cases = [
        ("store", "f32", "store f32"),
        ("store", "bf16 native", "store bf16 native"),
        ("retrieve", "f32 fresh", "retrieve f32 (fresh tensor)"),
        ("retrieve", "f32 into", "retrieve f32 (into buffer)"),
    ]
    for workload, name, label in cases:
        pts = series(figures, workload, name, vary, fixed)
        if len(pts) < 2:
            continue
        xs = [p[0] for p in pts]
        ax.plot(xs, [p[1] for p in pts], marker="o", label=label)
        ax.fill_between(xs, [p[2] for p in pts], [p[3] for p in pts], alpha=0.15)
    memcpy = ref_rate(figures, "store", "f32", vary, fixed, "memcpy")
    if len(memcpy) >= 2:
        ax.plot([p[0] for p in memcpy], [p[1] for p in memcpy], "k--", label="memcpy (same run)")
    if log_x:
        ax.set_xscale("log", base=2)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("GB/s (median; band = p25..p75)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def ratio_chart(data, ref, title, out, log_y=False):
    rows = []
    for f in data["figures"]:
        for r in f["refs"]:
            if r["name"] == ref and r["ratio"]["median"]:
                p = f["params"]
                tag = " ".join(
                    f"{k[0]}{p[key]}"
                    for k, key in (("c", "chunk_size"), ("h", "hidden_dim"), ("t", "tokens"),
                                   ("T", "threads"), ("L", "layers"))
                    if p.get(key))
                rows.append((f"{f['workload']}/{f['name']} {tag}", r["ratio"]))
    if not rows:
        return False
    fig, ax = plt.subplots(figsize=(9, max(3, 0.28 * len(rows))))
    ys = range(len(rows))
    med = [r[1]["median"] for r in rows]
    lo = [r[1]["median"] - r[1]["p25"] for r in rows]
    hi = [r[1]["p75"] - r[1]["median"] for r in rows]
    ax.barh(list(ys), med, xerr=[lo, hi], color="tab:blue", alpha=0.8)
    ax.axvline(1.0, color="k", linestyle="--", linewidth=1)
    ax.set_yticks(list(ys))
    ax.set_yticklabels([r[0] for r in rows], fontsize=7)
    ax.invert_yaxis()
    if log_y:
        ax.set_xscale("log")
    ax.set_xlabel(f"throughput / {ref} throughput (median, error bar p25..p75)")
    ax.set_title(title)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return True


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    data = load(argv[1])
    out = argv[2]
    os.makedirs(out, exist_ok=True)
    written = []
    path = os.path.join(out, "throughput_vs_prefix.png")
    line_chart(data, "tokens", {"hidden_dim": 4096, "chunk_size": 256, "layers": 1},
               "Throughput against prefix length (hidden_dim 4096, chunk 256)",
               "prefix length (tokens)", path, True)
    written.append(path)
    path = os.path.join(out, "throughput_vs_hidden.png")
    line_chart(data, "hidden_dim", {"tokens": 16384, "chunk_size": 256, "layers": 1},
               "Throughput against hidden_dim (16K-token prefix, chunk 256)", "hidden_dim", path,
               True)
    written.append(path)
    path = os.path.join(out, "ratio_to_memcpy.png")
    if ratio_chart(data, "memcpy", "Ratio to memcpy of the same bytes (same run)", path):
        written.append(path)
    path = os.path.join(out, "ratio_to_naive.png")
    if ratio_chart(data, "naive", "Ratio to the naive store (same run)", path, log_y=True):
        written.append(path)
    for w in written:
        print(w)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
