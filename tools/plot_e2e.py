#!/usr/bin/env python3
"""plot_e2e.py OUTDIR: the curves of tools/measure_e2e.sh, as SVG files.

Reads OUTDIR/summary.json (each ratio's median and range over the
repetitions) and writes, for the modes that ran:

  OUTDIR/plots/drift.svg         loads per unique shard against rank drift
                                 (the slow rank's lag in tasks): 1 rank alone,
                                 4 ranks with the protection, 4 ranks without
  OUTDIR/plots/drift_owners.svg  owner loads max/min across the 4 ranks
                                 against the same drift (a median of "inf",
                                 a rank that owned none, is a gap marked inf)
  OUTDIR/plots/hit_slots.svg     the per-shard hit overhead above memcpy at N
                                 slots over the same at 4k slots, against N
                                 (log scale), per kind of control page, beside
                                 memcpy's own growth (4 KiB shards)
  OUTDIR/plots/hit_shards.svg    the same overhead in ns against shard size
                                 (log scale), at 4k slots and at 64k

Each point is the median, its bar the range over the repetitions; a dashed
line is the goal. Standard library only (no matplotlib: run it with
/usr/bin/python3 or any Python 3); each file is a few KB.
"""
import json
import math
import os
import re
import sys
from xml.sax.saxutils import escape

W, H = 640, 400
LEFT, RIGHT, TOP, BOTTOM = 70, 190, 52, 55
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
DASHES = ["", "7 4", "2 3", "10 3 2 3"]  # so that curves on top of each other still show


def finite(x):
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None


def series(ratios, mode, pattern, label, x):
    """{label: [(x, median, min, max)]} from the metrics of MODE matching PATTERN."""
    out = {}
    for r in ratios:
        m = re.fullmatch(pattern, r["metric"]) if r["mode"] == mode else None
        if m and r["median"] is not None:
            # A median that is no number ("inf": a rank owned none) is a gap in the curve.
            out.setdefault(label(m), []).append((x(m), finite(r["median"]), finite(r["min"]), finite(r["max"])))
    return {k: sorted(v, key=lambda p: p[0]) for k, v in out.items()}


def nice_ticks(lo, hi, n=5):
    if hi <= lo:
        hi = lo + 1
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(s * mag for s in (1, 2, 2.5, 5, 10) if s * mag >= raw)
    t = math.floor(lo / step) * step
    ticks = [round(t, 10)]
    while ticks[-1] < hi - step * 1e-9:  # the last tick at or above hi: nothing is clipped
        t += step
        ticks.append(round(t, 10))
    return ticks


def short(kind):
    """A legend's name for a kind of control page (the legend is 190 px wide)."""
    return {"2 MiB hugetlb pages": "2 MiB hugetlb", "THP hint only": "THP hint"}.get(kind, kind)


def label_num(v):
    if v >= 1024 and v % 1024 == 0:
        return "%dk" % (v // 1024)
    return ("%.3g" % v) if v != int(v) else str(int(v))


def chart(title, xlabel, ylabel, data, goal=None, logx=False, note=None):
    """One SVG line chart: data is {label: [(x, median, min, max)]}."""
    xs = sorted({p[0] for pts in data.values() for p in pts})
    ys = [v for pts in data.values() for p in pts for v in p[1:] if v is not None] or [1.0]
    if goal is not None:
        ys.append(goal[0])
    ylo, yhi = min(0.0, min(ys)), max(ys) * 1.1 if max(ys) > 0 else 1.0
    yt = nice_ticks(ylo, yhi)
    ylo, yhi = yt[0], yt[-1]
    fx = (lambda v: math.log2(v)) if logx else (lambda v: float(v))
    xlo, xhi = fx(xs[0]), fx(xs[-1])
    if xhi == xlo:
        xlo, xhi = xlo - 1, xhi + 1
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM
    px = lambda v: LEFT + (fx(v) - xlo) / (xhi - xlo) * pw
    py = lambda v: TOP + ph - (min(max(v, ylo), yhi) - ylo) / (yhi - ylo) * ph
    e = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" '
         'font-family="sans-serif" font-size="11">' % (W, H, W, H),
         '<rect width="100%" height="100%" fill="white"/>',
         '<text x="%d" y="20" font-size="13" font-weight="bold">%s</text>' % (LEFT, escape(title))]
    for t in yt:
        y = py(t)
        e.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>' % (LEFT, y, LEFT + pw, y))
        e.append('<text x="%d" y="%.1f" text-anchor="end">%s</text>' % (LEFT - 6, y + 4, label_num(t)))
    for v in xs:
        x = px(v)
        e.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#eee"/>' % (x, TOP, x, TOP + ph))
        e.append('<text x="%.1f" y="%d" text-anchor="middle">%s</text>' % (x, TOP + ph + 16, label_num(v)))
    e.append('<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="black"/>' % (LEFT, TOP, pw, ph))
    e.append('<text x="%d" y="%d" text-anchor="middle">%s</text>' % (LEFT + pw // 2, H - 18, escape(xlabel)))
    e.append('<text transform="translate(16 %d) rotate(-90)" text-anchor="middle">%s</text>'
             % (TOP + ph // 2, escape(ylabel)))
    if goal is not None:
        y = py(goal[0])
        e.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="black" stroke-dasharray="5 4"/>'
                 % (LEFT, y, LEFT + pw, y))
        e.append('<text x="%d" y="%.1f" font-size="10">%s</text>' % (LEFT + 4, y - 4, escape(goal[1])))
    for i, (name, pts) in enumerate(sorted(data.items())):
        c, dash = COLORS[i % len(COLORS)], DASHES[i % len(DASHES)]
        style = 'fill="none" stroke="%s" stroke-width="2"%s' % (c, ' stroke-dasharray="%s"' % dash if dash else "")
        runs, cur = [], []
        for x, m, _, _ in pts:  # a gap (no number) ends a run of the curve
            if m is None:
                runs, cur = runs + [cur], []
            else:
                cur.append("%.1f,%.1f" % (px(x), py(m)))
        for run in runs + [cur]:
            if run:
                e.append('<polyline %s points="%s"/>' % (style, " ".join(run)))
        for x, m, lo, hi in pts:
            if m is None:
                e.append('<text x="%.1f" y="%d" text-anchor="middle" fill="%s">inf</text>' % (px(x), TOP - 3 - 11 * i, c))
                continue
            if lo is not None and hi is not None:
                e.append('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>' % (px(x), py(lo), px(x), py(hi), c))
            e.append('<circle cx="%.1f" cy="%.1f" r="%d" fill="%s"/>' % (px(x), py(m), 4 - i % 3, c))
        ly = TOP + 10 + 18 * i
        e.append('<line x1="%d" y1="%d" x2="%d" y2="%d" %s/>' % (LEFT + pw + 10, ly, LEFT + pw + 28, ly, style))
        e.append('<text x="%d" y="%d">%s</text>' % (LEFT + pw + 32, ly + 4, escape(name)))
    if note:
        e.append('<text x="%d" y="%d" font-size="10" fill="#555">%s</text>' % (LEFT + pw + 10, TOP + ph, escape(note)))
    e.append("</svg>")
    return "\n".join(e) + "\n"


def plots(ratios, machine):
    """[(file name, svg text)] for every plot whose mode ran."""
    out = []
    size = next((l for l in machine if l.startswith("drift lags:")), "")
    cache = re.search(r"cache (\d+) tasks", size)
    xlabel = "lag of the slow rank (tasks)" + ("; the cache holds %s tasks" % cache[1] if cache else "")
    lag = lambda m: int(m[2])
    d = series(ratios, "drift", r"loads per unique shard, (.+), lag (\d+) tasks", lambda m: m[1], lag)
    if d:
        out.append(("drift.svg", chart("Loads per unique shard against rank drift", xlabel,
                                       "backend loads per unique shard", d,
                                       note="median, bar: range")))
    d = series(ratios, "drift", r"owner loads max/min, (.+), lag (\d+) tasks", lambda m: "4 ranks, " + m[1], lag)
    if d:
        out.append(("drift_owners.svg", chart("Owner loads max/min across 4 ranks against rank drift", xlabel,
                                              "owner loads, max/min", d,
                                              goal=(1.5, "goal: 1.5 (with protection)"),
                                              note="inf: a rank owned none")))
    # The slot-count curve is at 4 KiB shards (the shard-size runs are at one slot count).
    d = series(ratios, "hit4k512k", r"hit overhead above memcpy, (.+), 4096-byte shards, (\d+) slots / (\d+) slots",
               lambda m: short(m[1]), lambda m: (int(m[2]), int(m[3])))
    mc = series(ratios, "hit4k512k", r"memcpy alone, 4096-byte shards, (\d+) slots / (\d+) slots, beside 4 KiB pages",
                lambda m: "memcpy alone", lambda m: (int(m[1]), int(m[2])))
    if d:
        curves = {}
        for name, pts in list(d.items()) + list(mc.items()):
            # Each run's ratio is to its own small size; the small size is the curve's 1.
            curves[name] = sorted({(s, 1.0, 1.0, 1.0) for (_, s), _, _, _ in pts} |
                                  {(n, m, lo, hi) for (n, _), m, lo, hi in pts})
        out.append(("hit_slots.svg", chart("Per-shard hit overhead above memcpy against slot count",
                                           "slots in the cache (log scale)",
                                           "at N slots / at the smallest (4k)", curves,
                                           goal=(1.2, "goal: 1.2 at 512k (huge pages)"), logx=True,
                                           note="memcpy alone: its time's growth")))
    d = series(ratios, "hit4k512k", r"hit overhead above memcpy \(ns\), (.+), (\d+)-byte shards, (\d+) slots",
               lambda m: "%s, %s slots" % (short(m[1]), label_num(int(m[3]))), lambda m: int(m[2]))
    if d and max(len(v) for v in d.values()) > 1:
        out.append(("hit_shards.svg", chart("Per-shard hit overhead above memcpy against shard size",
                                            "shard bytes (log scale)", "hit overhead above memcpy (ns)", d,
                                            logx=True, note="median, bar: range")))
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: plot_e2e.py OUTDIR (the directory tools/measure_e2e.sh wrote)")
    out = sys.argv[1]
    d = json.load(open(os.path.join(out, "summary.json")))
    os.makedirs(os.path.join(out, "plots"), exist_ok=True)
    made = plots(d["ratios"], d.get("machine", []))
    for name, svg in made:
        with open(os.path.join(out, "plots", name), "w") as f:
            f.write(svg)
        print("plot_e2e: plots/%s (%d bytes)" % (name, len(svg)))
    if not made:
        print("plot_e2e: no mode with a curve ran (drift, hit4k512k): no plot")


if __name__ == "__main__":
    main()
