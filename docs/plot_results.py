#!/usr/bin/python3
"""Plots for docs/results.md from ucm_bench's JSON files in docs/data/.

    /usr/bin/python3 docs/plot_results.py [DATA_DIR] [OUT_DIR]

Reads bench-cold-np*.json (the cold scenario at each rank count) and
bench-np4.json (warm, wait, evict, prealloc at 4 ranks); writes
cold_scaling.png, cold_skew.png, wait_latency.png and evict.png.
Needs Debian's python3-matplotlib (the system python, not a pyenv one).
"""
import glob
import json
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "data")
OUT = sys.argv[2] if len(sys.argv) > 2 else HERE


def load(path):
    with open(path) as f:
        return json.load(f)


def cold_runs():
    runs = {}
    for p in glob.glob(os.path.join(DATA, "bench-cold-np*.json")):
        m = re.search(r"np(\d+)\.json$", p)
        if m:
            runs[int(m.group(1))] = load(p)["cold"]
    return dict(sorted(runs.items()))


def mode(cold, name):
    for m in cold["modes"]:
        if m["name"] == name:
            return m
    return None


def plot_cold_scaling(runs):
    ranks = list(runs)
    series = [("natural", "natural"), ("rotate", "rotate"),
              ("natural, shard by shard (seed legacy, emulated)", "shard by shard (seed legacy, emulated)")]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, label in series:
        a.plot(ranks, [mode(runs[r], name)["task_ms"] for r in ranks], "o-", label=label)
    a.set_xlabel("ranks (one node, 2 cores)")
    a.set_ylabel("cold task time, slowest rank (ms)")
    a.set_title("cold task: 8 shards per rank, 4 ms per shard, io depth 1")
    a.set_xscale("log", base=2)
    a.set_xticks(ranks, [str(r) for r in ranks])
    a.grid(alpha=0.3)
    a.legend(fontsize=8)
    rot = [mode(runs[r], "rotate")["task_ms"] for r in ranks]
    for name, label in series[::2]:
        b.plot(ranks, [mode(runs[r], name)["task_ms"] / t for r, t in zip(ranks, rot)], "o-",
               label=f"{label} / rotate")
    b.plot(ranks, [0.9 * r for r in ranks], "k--", label="target 0.9 x ranks")
    b.plot(ranks, [mode(runs[r], "rotate")["mean_concurrency"] for r in ranks], "s:",
           label="rotate: mean backend concurrency")
    b.set_xlabel("ranks")
    b.set_ylabel("speedup of rotate (x)")
    b.set_xscale("log", base=2)
    b.set_xticks(ranks, [str(r) for r in ranks])
    b.grid(alpha=0.3)
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(OUT, "cold_scaling.png"), dpi=110)
    plt.close(fig)


def plot_cold_skew(runs):
    big = [r for r in runs if r >= 4]
    if not big:
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for r in big:
        cold = runs[r]
        skew_modes = [m for m in cold["modes"] if m["group"] == "skew"]
        skews = sorted({m["skew_us"] for m in skew_modes})
        for kind, style in (("natural", ":"), ("rotate, grace default", "-"), ("rotate, grace 0", "--")):
            ms = [next(m for m in skew_modes if m["name"] == f"{kind}, skew {s} us") for s in skews]
            lbl = f"{r} ranks, {kind}"
            axes[0].plot(range(len(skews)), [m["task_ms"] for m in ms], "o" + style, label=lbl)
            bal = [m["owner_balance_max_over_min"] for m in ms]
            axes[1].plot(range(len(skews)), [b if b is not None else float("nan") for b in bal], "o" + style,
                         label=lbl)
        for ax in axes:
            ax.set_xticks(range(len(skews)), [f"{s} us" for s in skews])
    axes[0].set_ylabel("task time, slowest rank (ms)")
    axes[0].set_xlabel("skew (rank r submits r x skew late)")
    axes[1].set_ylabel("owner loads per rank, max / min")
    axes[1].set_xlabel("skew; a missing point: some rank owned nothing")
    axes[1].set_yscale("log")
    axes[1].yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    axes[1].yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    axes[1].set_yticks([1, 1.5, 2, 3, 4, 6])
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"skewed arrival, io depth {runs[big[0]]['skew_io_depth']}: owner_grace default (1 ms) vs 0")
    fig.tight_layout()
    fig.savefig(os.path.join(OUT, "cold_skew.png"), dpi=110)
    plt.close(fig)


def plot_wait(d):
    w = d.get("wait")
    if not w or "modes" not in w:
        return
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for m in w["modes"]:
        xs = sorted(max(x, 1.0) for x in m["waiter_after_ready_us"])
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        ax.step(xs, ys, where="post", label=f"wait={m['wait']} (p50 {m['waiter_after_ready_us_p50']:.0f} us)")
    ax.set_xscale("log")
    ax.set_xlabel("waiter's task end after the first sight of Ready (us, log; < 1 us drawn at 1)")
    ax.set_ylabel("fraction of waiter tasks")
    ax.set_title(f"wake latency, {d['ranks']} ranks: rank 0 owns, {d['ranks'] - 1} wait")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(OUT, "wait_latency.png"), dpi=110)
    plt.close(fig)


def plot_evict(d):
    ev = d.get("evict")
    if not ev:
        return
    fig, axes = plt.subplots(1, len(ev), figsize=(5.5 * len(ev), 4.2), squeeze=False)
    for ax, run in zip(axes[0], ev):
        names = [m["mode"] for m in run["modes"]]
        wasted = [m["wasted_loads"] for m in run["modes"]]
        after = [m["wasted_loads_after_first_evicting_task"] for m in run["modes"]]
        xs = range(len(names))
        ax.bar([x - 0.2 for x in xs], wasted, 0.4, label="wasted loads, all tasks")
        ax.bar([x + 0.2 for x in xs], after, 0.4, label="after the first evicting task")
        ax.set_xticks(list(xs), names, fontsize=8)
        ax.set_title(f"{run['slots']} slots: {run['hot']} hot + {run['cold_per_task']} cold per task, "
                     f"{run['tasks']} tasks")
        ax.set_ylabel("loads beyond one per non-resident key")
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(OUT, "evict.png"), dpi=110)
    plt.close(fig)


def main():
    runs = cold_runs()
    if runs:
        plot_cold_scaling(runs)
        plot_cold_skew(runs)
    p = os.path.join(DATA, "bench-np4.json")
    if os.path.exists(p):
        d = load(p)
        plot_wait(d)
        plot_evict(d)
    print("plots written to", OUT)


if __name__ == "__main__":
    main()
