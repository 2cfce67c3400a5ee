#!/usr/bin/env python3
"""scripts/lib/bench-warm-report.py RAWDIR OUTDIR: the analysis half of `scripts/bench warm`.

Reads what scripts/lib/bench-warm left in RAWDIR (params.env, env.json, samples.jsonl with a
`boot` line per clone booted, and per clone NAME = coldREP / warmREP: NAME.after.json, its
volume document after the boot and its warm, and NAME.warmset.json) and writes
  OUTDIR/warm.json  per rep and clone kind: boot seconds, blocks fetched, GETs, bytes, the
                    warm's report; the medians (min-max); the two figures with their goals
  OUTDIR/warm.png   boot time and bytes fetched, cold vs warm, per rep (gnuplot; skipped
                    with a note when missing)
and prints the table. The figures:
  speed-up    cold boot seconds / warm boot seconds, per rep (goal >= 2)
  over-fetch  bytes the warm clone fetched (its warm and its boot) / bytes the cold clone
              fetched (its boot, readahead included), per rep (goal <= 1.5)
Standard library only.
"""

import json
import os
import sys
import time

from bench_raw import gnuplot, load_json, read_jsonl, read_params, spread

SPEEDUP_GOAL = 2.0
OVERFETCH_GOAL = 1.5




def f(v, fmt):
    return "-" if v is None else fmt.format(v)


def cell(s, fmt):
    if not s:
        return "-"
    if s["min"] == s["max"]:
        return f(s["median"], fmt)
    return f"{f(s['median'], fmt)} ({f(s['min'], fmt)}-{f(s['max'], fmt)})"


def main():
    raw, outdir = sys.argv[1], sys.argv[2]
    params = read_params(raw)
    reps = int(params.get("reps", "1"))
    samples = read_jsonl(os.path.join(raw, "samples.jsonl"))
    env = load_json(os.path.join(raw, "env.json")) or {}
    img_set = (load_json(os.path.join(raw, "img.warmset.json")) or {}).get("stored") or {}
    boots = {(s["clone"], s["rep"]): s for s in samples if s.get("kind") == "boot"}
    setup = next((s for s in samples if s.get("kind") == "setup"), {})

    runs, missing = {"cold": [], "warm": []}, []
    for rep in range(1, reps + 1):
        for kind in ("cold", "warm"):
            s = boots.get((kind, rep))
            doc = load_json(os.path.join(raw, f"{kind}{rep}.after.json"))
            ws = load_json(os.path.join(raw, f"{kind}{rep}.warmset.json")) or {}
            if s is None or doc is None:
                missing.append(f"{kind} rep {rep}")
                continue
            lw = ws.get("last_warm") or {}
            runs[kind].append({
                "rep": rep,
                "boot_s": s["boot_s"],
                "create_s": s.get("create_s"),
                "blocks_fetched": doc.get("cold_reads"),
                "gets": doc.get("store_gets"),
                "bytes_fetched": doc.get("fetched_bytes"),
                "warm_blocks": lw.get("fetched_blocks"),
                "warm_bytes": lw.get("fetched_bytes"),
                "warm_gets": lw.get("gets"),
                "warm_ms": lw.get("took_ms"),
                "warm_note": lw.get("note"),
            })
    keys = ["boot_s", "create_s", "blocks_fetched", "gets", "bytes_fetched", "warm_blocks",
            "warm_bytes", "warm_gets", "warm_ms"]
    results = {k: {key: spread([r.get(key) for r in rows]) for key in keys}
               for k, rows in runs.items()}
    by = {(k, r["rep"]): r for k, rows in runs.items() for r in rows}
    speedups, overfetch = [], []
    for rep in range(1, reps + 1):
        c, w = by.get(("cold", rep)), by.get(("warm", rep))
        if c and w and w["boot_s"]:
            speedups.append(c["boot_s"] / w["boot_s"])
        if c and w and c.get("bytes_fetched"):
            overfetch.append(w["bytes_fetched"] / c["bytes_fetched"])
    sp, of = spread(speedups), spread(overfetch)
    figures = {
        "speedup": {**(sp or {}), "per_rep": speedups, "goal": f">= {SPEEDUP_GOAL}",
                    "met": (sp["median"] >= SPEEDUP_GOAL) if sp else None},
        "overfetch": {**(of or {}), "per_rep": overfetch, "goal": f"<= {OVERFETCH_GOAL}",
                      "met": (of["median"] <= OVERFETCH_GOAL) if of else None},
    }
    doc = {
        "benchmark": "a clone of an ext4 image booted cold and with its origin's warm set "
                     "(scripts/bench warm)",
        "generated": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "environment": "QEMU TCG guest via scripts/ublk-vm, 2 vCPUs; the store "
                       f"{params.get('store_latency')} ms away: compare the ratios of one run",
        "complete": not os.path.exists(os.path.join(raw, "failed")),
        "env": env,
        "params": params,
        "warm_set": img_set,
        "setup": setup,
        "figures": figures,
        "results": results,
        "runs": runs,
        "missing": missing,
    }
    os.makedirs(outdir, exist_ok=True)
    with open(os.path.join(outdir, "warm.json"), "w") as fh:
        json.dump(doc, fh, indent=2)
    chart = write_chart(raw, outdir, runs, reps)

    print(f"\nwarm: an ext4 image ({params.get('size')}, {params.get('boot_files')} boot files among "
          f"{params.get('noise_mib')} MiB of others), its clones booted cold and warm, the store "
          f"{params.get('store_latency')} ms away, median (min-max) of {reps} rep"
          f"{'s' if reps != 1 else ''} (kernel {env.get('kernel', '?')})")
    if reps < 3:
        print("fewer than 3 reps: a development run, not a measurement")
    print(f"warm set of the image: {img_set.get('blocks', '?')} blocks of "
          f"{img_set.get('block_size', '?')} bytes (recorded over a boot of "
          f"{f(setup.get('record_boot_s'), '{:.2f}')} s)")
    rows = [("boot s", "boot_s", "{:.2f}"), ("blocks fetched", "blocks_fetched", "{:.0f}"),
            ("GETs", "gets", "{:.0f}"), ("MiB fetched", "bytes_fetched", None),
            ("of which the warm: blocks", "warm_blocks", "{:.0f}"),
            ("  GETs", "warm_gets", "{:.0f}"), ("  ms", "warm_ms", "{:.0f}"),
            ("clone create s", "create_s", "{:.2f}")]
    print(f"{'figure':<28}{'cold':>24}{'warm':>24}")
    for title, key, fmt in rows:
        vals = []
        for kind in ("cold", "warm"):
            s = results[kind].get(key)
            if key == "bytes_fetched" and s:
                s = {k: (v / 2**20 if isinstance(v, (int, float)) and k != "n" else v)
                     for k, v in s.items()}
            vals.append(cell(s, fmt or "{:.1f}"))
        if all(v == "-" for v in vals):
            continue
        print(f"{title:<28}{vals[0]:>24}{vals[1]:>24}")
    print(f"\nspeed-up (cold / warm boot time): {cell(sp, '{:.2f}')}  goal >= {SPEEDUP_GOAL}: "
          f"{'no data' if sp is None else ('met' if figures['speedup']['met'] else 'NOT met')}")
    print(f"over-fetch (warm / cold bytes fetched): {cell(of, '{:.2f}')}  goal <= {OVERFETCH_GOAL}: "
          f"{'no data' if of is None else ('met' if figures['overfetch']['met'] else 'NOT met')}")
    for m in missing:
        print(f"missing: {m}")
    print(f"\nwrote {os.path.join(outdir, 'warm.json')}" + (f", {chart}" if chart else ""))


def write_chart(raw, outdir, runs, reps):
    dat = os.path.join(raw, "chart.dat")
    by = {(k, r["rep"]): r for k, rows in runs.items() for r in rows}
    with open(dat, "w") as fh:
        for rep in range(1, reps + 1):
            c, w = by.get(("cold", rep), {}), by.get(("warm", rep), {})
            mib = lambda r: (r.get("bytes_fetched") or 0) / 2**20  # noqa: E731
            fh.write(f'"rep {rep}" {c.get("boot_s", 0)} {w.get("boot_s", 0)} {mib(c):.2f} {mib(w):.2f}\n')
    png = os.path.join(outdir, "warm.png")
    script = os.path.join(raw, "chart.gp")
    text = (f"""
set terminal pngcairo size 1200,480 noenhanced font ",10"
set output "{png}"
set multiplot layout 1,2
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.7 border -1
set yrange [0:*]
set grid ytics
set key top left
set title "boot time of a clone (s)"
plot "{dat}" using 2:xtic(1) title "cold" lc rgb "gray50", "" using 3 title "with the warm set" lc rgb "steelblue"
set title "bytes fetched from the store (MiB)"
plot "{dat}" using 4:xtic(1) title "cold" lc rgb "gray50", "" using 5 title "with the warm set" lc rgb "steelblue"
unset multiplot
""")
    return gnuplot(script, text, png, "bench-warm-report")


if __name__ == "__main__":
    main()
