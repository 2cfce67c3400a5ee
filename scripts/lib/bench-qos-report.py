#!/usr/bin/env python3
"""scripts/lib/bench-qos-report.py RAWDIR OUTDIR: the analysis half of `scripts/bench qos`.

Reads what scripts/lib/bench-qos left in RAWDIR (params.env, env.json, samples.jsonl, per
phase and rep: A.PHASE.rREP.fio.json, B.PHASE.rREP.fio.json, the volume documents
{A,B}.PHASE.rREP.volume.{before,after}.json and B's per-second bandwidth logs
bwlog-B-PHASE-rREP_bw*.log) and writes
  OUTDIR/qos.json   per phase: medians with min/max over the reps; per rep: every figure;
                    the two figures the QoS issue asks for, with their goals
  OUTDIR/qos.png    left: A's p99 read latency per phase (median, min-max over the reps);
                    right: B's bandwidth per second in the limited phase, a line per rep, the
                    limit as a horizontal line (gnuplot; skipped with a note when missing)
and prints the table. The figures:
  (a) A's clat p99 with B limited / alone (goal <= 1.5), noisy / alone for contrast and
      paced / alone (B at the limit's rate by fio itself, no limit) as the control:
      ratios of the medians over the reps, with the min-max of the per-rep ratios (the
      phases of one rep ran back to back)
  (b) B's bandwidth in the limited phase / the limit (goal 0.95..1.05): from the per-second
      log with the first RAMP s excluded (see bw_log), and from fio's write.bw_bytes (fio
      resets its counters when the ramp ends, so that one excludes the ramp too); and the
      worst per-second deviation from the limit
Standard library only.
"""

import glob
import json
import os
import statistics
import sys
import time

from bench_raw import gnuplot, load_json, read_jsonl, read_params, spread

PHASES = ["alone", "noisy", "paced", "limited"]
MIB = 2**20
P99_GOAL = 1.5
BW_GOAL = (0.95, 1.05)


def die(msg):
    sys.exit(f"bench-qos-report: {msg}")






def fio_job(path):
    j = load_json(path)
    try:
        return j["jobs"][0]
    except (TypeError, KeyError, IndexError):
        return None


def fio_a(path):
    """A's figures: IOPS and completion latency (µs) of its reads."""
    job = fio_job(path)
    if job is None:
        return None
    r = job["read"]
    pct = r["clat_ns"].get("percentile", {})

    def p(key):
        return pct[key] / 1000 if key in pct else None

    return {
        "a_iops": r["iops"],
        "a_p50_us": p("50.000000"),
        "a_p90_us": p("90.000000"),
        "a_p99_us": p("99.000000"),
        "a_p999_us": p("99.900000"),
        "a_mean_us": r["clat_ns"]["mean"] / 1000,
        "a_max_us": r["clat_ns"]["max"] / 1000,
        "a_errors": job.get("error", 0),
    }


def fio_b(path):
    """B's figures: its write bandwidth over the run (fio's, after the ramp)."""
    job = fio_job(path)
    if job is None:
        return None
    w = job["write"]
    return {
        "b_mib_s": w["bw_bytes"] / MIB,
        "b_bw_bytes": w["bw_bytes"],
        "b_iops": w["iops"],
        "b_io_mib": w["io_bytes"] / MIB,
        "b_runtime_s": w["runtime"] / 1000,
        "b_clat_p99_us": w["clat_ns"].get("percentile", {}).get("99.000000", 0) / 1000,
        "b_errors": job.get("error", 0),
    }


def bw_log(raw, phase, rep, ramp_s, runtime_s, t0_ms=None):
    """B's per-second write bandwidth: [(t_s, bytes_per_s)] after the ramp, or None.

    With the phase's start T0_MS (Unix ms) and a log in Unix times (fio --log_unix_epoch):
    the samples that end after the ramp and no later than half a second after the runtime
    (fio logs more while it waits out the requests still queued when the time was up, 32 of
    them held by the limit: not the job's rate), their times from the ramp's end. Else, an
    older run's log:

    fio's bw log lines: time (ms since the job's epoch), value (KiB/s with --log_avg_msec),
    direction (1: write), block size, offset[, priority]. Depending on the fio version the
    ramp is logged or not, and the epoch restarts when the ramp ends or not; so: if the time
    ever goes back, only what follows the last step back counts (the time after the ramp);
    otherwise the samples up to RAMP s are dropped (if the ramp was not logged, that drops
    the first seconds of the measured run, which only makes the figure stricter). A last
    sample over less than half an interval (the job's end) is dropped too: at 128k per
    request a short window has too few requests to mean a rate."""
    paths = sorted(glob.glob(os.path.join(raw, f"bwlog-B-{phase}-r{rep}_bw*.log")))
    if not paths:
        return None
    rows = []
    with open(paths[0]) as fh:
        for line in fh:
            parts = [x.strip() for x in line.split(",")]
            if len(parts) < 3:
                continue
            try:
                t, v, d = int(parts[0]), int(parts[1]), int(parts[2])
            except ValueError:
                continue
            if d == 1:
                rows.append((t, v * 1024))
    if not rows:
        return None
    if t0_ms is not None and rows[0][0] > 10**12:
        start = t0_ms + ramp_s * 1000
        end = start + (runtime_s + 0.5) * 1000
        return [((t - start) / 1000, bps) for t, bps in rows if start < t <= end] or None
    last_reset = 0
    for i in range(1, len(rows)):
        if rows[i][0] < rows[i - 1][0]:
            last_reset = i
    rows = rows[last_reset:]
    if last_reset == 0:
        rows = [r for r in rows if r[0] > ramp_s * 1000]
    if len(rows) >= 2 and rows[-1][0] - rows[-2][0] < 500:
        rows = rows[:-1]
    return [(t / 1000, bps) for t, bps in rows]


def throttled(before, after):
    """B's throttled requests and seconds over a phase (None without the documents)."""
    if not before or not after:
        return None, None
    b, a = before.get("throttled") or {}, after.get("throttled") or {}
    if "requests" not in a:
        return None, None
    return a["requests"] - b.get("requests", 0), a["seconds"] - b.get("seconds", 0.0)



def main():
    if len(sys.argv) != 3:
        die("usage: bench-qos-report.py RAWDIR OUTDIR")
    raw, outdir = sys.argv[1], sys.argv[2]
    params = read_params(raw)
    global PHASES
    ran = params.get("phases", ",".join(PHASES)).split(",")
    PHASES = [ph for ph in PHASES if ph in ran]
    reps = int(params.get("reps", "1"))
    ramp_s = float(params.get("ramp", "2"))
    runtime_s = float(params.get("runtime", "60"))
    limit = int(params["limit_bytes"])
    samples = read_jsonl(os.path.join(raw, "samples.jsonl"))
    env = load_json(os.path.join(raw, "env.json")) or {}
    phase_samples = {(s["phase"], s["rep"]): s for s in samples if s.get("kind") == "phase"}

    runs, bwlogs, missing = {}, {}, []
    for rep in range(1, reps + 1):
        for ph in PHASES:
            s = phase_samples.get((ph, rep))
            a = fio_a(os.path.join(raw, f"A.{ph}.r{rep}.fio.json"))
            if s is None or a is None:
                missing.append(f"{ph} rep {rep}: " + ("no sample" if s is None else "no fio JSON for A"))
                continue
            row = {"rep": rep, **a}
            if ph != "alone":
                b = fio_b(os.path.join(raw, f"B.{ph}.r{rep}.fio.json"))
                if b is None:
                    missing.append(f"{ph} rep {rep}: no fio JSON for B")
                else:
                    row.update(b)
                    row["b_over_limit_fio"] = b["b_bw_bytes"] / limit
                log = bw_log(raw, ph, rep, ramp_s, runtime_s, s.get("t0_unix_ms"))
                if log:
                    bwlogs[(ph, rep)] = log
                    vals = [v for _, v in log]
                    mean = statistics.fmean(vals)
                    row["b_log_mib_s"] = mean / MIB
                    row["b_log_seconds"] = len(vals)
                    row["b_log_min_mib_s"] = min(vals) / MIB
                    row["b_log_max_mib_s"] = max(vals) / MIB
                    row["b_over_limit_log"] = mean / limit
                    devs = [(abs(v / limit - 1), t) for t, v in log]
                    worst, worst_t = max(devs)
                    row["b_worst_second_dev"] = worst
                    row["b_worst_second_t_s"] = worst_t
                    row["b_seconds_within_5pct"] = sum(1 for d, _ in devs if d <= 0.05) / len(devs)
                elif ph == "limited":
                    missing.append(f"limited rep {rep}: no bandwidth log for B")
            vol = {v: {w: load_json(os.path.join(raw, f"{v}.{ph}.r{rep}.volume.{w}.json"))
                       for w in ("before", "after")} for v in ("A", "B")}
            row["b_throttled_requests"], row["b_throttled_s"] = throttled(vol["B"]["before"], vol["B"]["after"])
            if vol["A"]["before"] and vol["A"]["after"]:
                row["a_cold_reads"] = vol["A"]["after"]["cold_reads"] - vol["A"]["before"]["cold_reads"]
            if s.get("cpu_ticks_before") is not None and s.get("cpu_ticks_after") is not None:
                cpu_s = (s["cpu_ticks_after"] - s["cpu_ticks_before"]) / s["clk_tck"]
                row["daemon_cpu_s"] = cpu_s
                row["daemon_cpu_pct"] = 100 * cpu_s / s["wall_s"] if s["wall_s"] else None
            for k in ("wall_s", "settle_s", "settle_bytes", "gc_s", "mem_used_mib", "store_mib",
                      "data_dir_mib", "rc_a", "rc_b"):
                row[k] = s.get(k)
            if s.get("rc_a") or s.get("rc_b"):
                missing.append(f"{ph} rep {rep}: fio exited {s.get('rc_a')} (A), {s.get('rc_b')} (B)")
            runs.setdefault(ph, []).append(row)

    keys = sorted({k for rows in runs.values() for r in rows for k in r if k != "rep"})
    results = {ph: {k: spread([r.get(k) for r in rows]) for k in keys
                    if any(isinstance(r.get(k), (int, float)) for r in rows)}
               for ph, rows in runs.items()}

    def med(ph, k):
        v = results.get(ph, {}).get(k)
        return v["median"] if v else None

    def ratio(num, den, key):
        a, b = med(num, key), med(den, key)
        if not a or not b:
            return None
        ra = {r["rep"]: r.get(key) for r in runs.get(num, [])}
        rb = {r["rep"]: r.get(key) for r in runs.get(den, [])}
        per = [ra[k] / rb[k] for k in ra if ra[k] and rb.get(k)]
        return {"ratio": a / b, "min": min(per) if per else None, "max": max(per) if per else None,
                "per_rep": per}

    p99_limited = ratio("limited", "alone", "a_p99_us")
    p99_noisy = ratio("noisy", "alone", "a_p99_us")
    p99_paced = ratio("paced", "alone", "a_p99_us")
    lim_rows = runs.get("limited", [])
    log_ratios = [r["b_over_limit_log"] for r in lim_rows if r.get("b_over_limit_log") is not None]
    fio_ratios = [r["b_over_limit_fio"] for r in lim_rows if r.get("b_over_limit_fio") is not None]
    worst = max(((r["b_worst_second_dev"], r["rep"], r["b_worst_second_t_s"]) for r in lim_rows
                 if r.get("b_worst_second_dev") is not None), default=None)

    def within(xs):
        return bool(xs) and all(BW_GOAL[0] <= x <= BW_GOAL[1] for x in xs)

    figures = {
        "a_p99_limited_over_alone": {
            **(p99_limited or {}), "goal": f"<= {P99_GOAL}",
            "met": (p99_limited["ratio"] <= P99_GOAL) if p99_limited else None},
        "a_p99_noisy_over_alone": {**(p99_noisy or {}), "note": "contrast: B without a limit"},
        "a_p99_paced_over_alone": {**(p99_paced or {}),
                                   "note": "control: B without a limit, fio held at the limit's rate"},
        "b_limited_over_limit": {
            "limit_bytes_per_s": limit,
            "from_bw_log": spread(log_ratios),
            "from_fio_bw_bytes": spread(fio_ratios),
            "goal": f"{BW_GOAL[0]}..{BW_GOAL[1]} (every rep, both measures)",
            "met": (all(within(xs) for xs in (log_ratios, fio_ratios) if xs)
                    if log_ratios or fio_ratios else None),
            "worst_second_deviation": ({"deviation": worst[0], "rep": worst[1], "t_s": worst[2]}
                                       if worst else None),
            "seconds_within_5pct": spread([r.get("b_seconds_within_5pct") for r in lim_rows]),
        },
    }
    doc = {
        "benchmark": "noisy neighbour with and without a per-volume QoS limit (scripts/bench qos)",
        "generated": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "environment": "QEMU TCG guest via scripts/ublk-vm, 2 vCPUs: absolute numbers are far "
                       "below native hardware; compare the ratios of one run",
        "complete": not os.path.exists(os.path.join(raw, "failed")),
        "env": env,
        "params": params,
        "jobs": {
            "A": f"--ioengine=io_uring --direct=1 --rw=randread --bs=4k --iodepth=1 --time_based "
                 f"--runtime={params.get('runtime')} --ramp_time={params.get('ramp')} --norandommap "
                 f"(volume A, {params.get('size_a')}, written once and flushed: cache hits)",
            "B": f"--ioengine=io_uring --direct=1 --rw=write --bs=128k --iodepth=32 --time_based "
                 f"--runtime={params.get('runtime')} --ramp_time={params.get('ramp')} "
                 f"(volume B, {params.get('size_b')}; noisy: no limit; paced: no limit, fio "
                 f"--rate={params.get('limit_bytes')}; limited: --write-bps {params.get('limit')})",
        },
        "method": "phases alone, noisy, paced, limited interleaved per rep; before each, B flushed and "
                  "`glidefs gc --volume B`; medians over the reps (min/max); latencies are fio's "
                  "clat of A's reads in µs; b_log_*: B's per-second bandwidth log after the ramp; "
                  "daemon_cpu_*: utime+stime of the daemon over the phase (ramp included)",
        "figures": figures,
        "results": results,
        "runs": runs,
        "missing": missing,
        "daemon": [s for s in samples if s.get("kind") == "daemon"],
        "setup": [s for s in samples if s.get("kind") == "setup"],
        "failed_vm_exit": (int(open(os.path.join(raw, "failed")).read().strip() or 0)
                           if os.path.exists(os.path.join(raw, "failed")) else None),
    }
    os.makedirs(outdir, exist_ok=True)
    out = os.path.join(outdir, "qos.json")
    with open(out, "w") as fh:
        json.dump(doc, fh, indent=2)

    chart = write_chart(raw, outdir, results, bwlogs, limit, reps, ramp_s)
    print_table(doc, results, runs, reps, limit)
    print(f"\nwrote {out}" + (f", {chart}" if chart else ""))


# ------------------------------------------------------------------------------ table

def f(v, fmt="{:.1f}"):
    return "-" if v is None else fmt.format(v)


def cell(s, fmt="{:.1f}"):
    if not s:
        return "-"
    if s["n"] < 2:
        return f(s["median"], fmt)
    return f"{f(s['median'], fmt)} ({f(s['min'], fmt)}-{f(s['max'], fmt)})"


def rcell(r, fmt="{:.2f}"):
    if not r or r.get("ratio") is None:
        return "-"
    if r.get("min") is None or r["min"] == r["max"]:
        return f(r["ratio"], fmt)
    return f"{f(r['ratio'], fmt)} ({f(r['min'], fmt)}-{f(r['max'], fmt)})"


def verdict(met):
    return "no data" if met is None else ("met" if met else "NOT met")


def print_table(doc, results, runs, reps, limit):
    p, env, fig = doc["params"], doc["env"], doc["figures"]
    print(f"\nqos: A {p.get('size_a')} 4k randread QD1 beside B {p.get('size_b')} 128k write QD32, "
          f"limit {p.get('limit')} ({limit / MIB:.1f} MiB/s), store latency {p.get('store_latency')} ms, "
          f"{p.get('runtime')} s per phase after a {p.get('ramp')} s ramp, median (min-max) of {reps} "
          f"rep{'s' if reps != 1 else ''} (kernel {env.get('kernel', '?')}, {env.get('cpus', '?')} cpus)")
    if not doc["complete"]:
        print(f"INCOMPLETE: the VM part failed (exit {doc['failed_vm_exit']}); these are the phases it finished")
    if reps < 3:
        print(f"only {reps} rep{'s' if reps != 1 else ''}: a development run, not a measurement (use >= 3)")
    cols = [
        ("A IOPS", "a_iops", "{:.0f}"),
        ("A p50 us", "a_p50_us", "{:.0f}"),
        ("A p99 us", "a_p99_us", "{:.0f}"),
        ("A p99.9 us", "a_p999_us", "{:.0f}"),
        ("A mean us", "a_mean_us", "{:.0f}"),
        ("B MiB/s (fio)", "b_mib_s", "{:.1f}"),
        ("B MiB/s (log)", "b_log_mib_s", "{:.1f}"),
        ("B throttled req", "b_throttled_requests", "{:.0f}"),
        ("B throttled s", "b_throttled_s", "{:.1f}"),
        ("daemon CPU % (1 CPU = 100)", "daemon_cpu_pct", "{:.0f}"),
        ("flush B before s", "settle_s", "{:.1f}"),
    ]
    w, lw = 24, 27
    print(f"{'figure':<{lw}}" + "".join(f"{ph:>{w}}" for ph in PHASES))
    for title, k, fmt in cols:
        vals = [cell(results.get(ph, {}).get(k), fmt) for ph in PHASES]
        if all(v == "-" for v in vals):
            continue
        print(f"{title:<{lw}}" + "".join(f"{v:>{w}}" for v in vals))
    cold = [r.get("a_cold_reads") for rows in runs.values() for r in rows if r.get("a_cold_reads")]
    if cold:
        print(f"note: A read {sum(cold)} blocks from the store during the phases (expected 0: not all cache hits)")

    a, n, b = fig["a_p99_limited_over_alone"], fig["a_p99_noisy_over_alone"], fig["b_limited_over_limit"]
    c = fig["a_p99_paced_over_alone"]
    print("\nper rep (A p99 us alone / noisy / paced / limited; B limited MiB/s from the log, fio):")
    by = {(ph, r["rep"]): r for ph, rows in runs.items() for r in rows}
    for rep in range(1, reps + 1):
        lim = by.get(("limited", rep), {})
        print(f"  rep {rep}: " + " / ".join(f(by.get((ph, rep), {}).get("a_p99_us"), "{:.0f}") for ph in PHASES)
              + f"; {f(lim.get('b_log_mib_s'), '{:.2f}')}, {f(lim.get('b_mib_s'), '{:.2f}')}")
    print("\n(a) A's p99 read latency, B limited / A alone: "
          f"{rcell(a)}  goal <= {P99_GOAL}: {verdict(a.get('met'))}")
    print(f"    with B noisy (no limit) / A alone, for contrast: {rcell(n)}")
    print(f"    with B paced by fio at the limit (no limit) / A alone, the control: {rcell(c)}")
    print(f"(b) B's bandwidth in the limited phase / the limit ({limit / MIB:.1f} MiB/s), "
          f"goal {BW_GOAL[0]}..{BW_GOAL[1]}: {verdict(b.get('met'))}")
    print(f"    from the per-second log (first {doc['params'].get('ramp')} s excluded): "
          f"{cell(b['from_bw_log'], '{:.3f}')}")
    print(f"    from fio's write.bw_bytes:                 {cell(b['from_fio_bw_bytes'], '{:.3f}')}")
    wd = b["worst_second_deviation"]
    if wd:
        print(f"    worst second: {100 * wd['deviation']:.1f} % off the limit (rep {wd['rep']}, "
              f"t = {wd['t_s']:.0f} s); seconds within 5 %: "
              f"{cell(b['seconds_within_5pct'], '{:.0%}')}")
    for m in doc["missing"]:
        print(f"missing: {m}")


# ------------------------------------------------------------------------------ chart

def write_chart(raw, outdir, results, bwlogs, limit, reps, ramp_s):
    lat = os.path.join(raw, "chart-p99.dat")
    with open(lat, "w") as fh:
        for i, ph in enumerate(PHASES):
            s = results.get(ph, {}).get("a_p99_us")
            if s:
                fh.write(f'{i} "{ph}" {s["median"]:.2f} {s["min"]:.2f} {s["max"]:.2f}\n')
            else:
                fh.write(f'{i} "{ph}" ? ? ?\n')
    series = []
    for rep in range(1, reps + 1):
        log = bwlogs.get(("limited", rep))
        if not log:
            continue
        dat = os.path.join(raw, f"chart-bw-r{rep}.dat")
        with open(dat, "w") as fh:
            for t, v in log:
                fh.write(f"{t:.3f} {v / MIB:.4f}\n")
        series.append(f'"{dat}" using 1:2 with linespoints pt 7 ps 0.5 title "rep {rep}"')
    lim = limit / MIB
    top = max([lim * 1.3] + [v / MIB * 1.05 for rep in range(1, reps + 1)
                             for _, v in bwlogs.get(("limited", rep), [])])
    series += [f'{lim:.4f} with lines lw 2 lc rgb "black" title "limit"',
               f'{lim * BW_GOAL[0]:.4f} with lines dt 2 lc rgb "gray40" title "limit -/+ 5 %"',
               f'{lim * BW_GOAL[1]:.4f} with lines dt 2 lc rgb "gray40" notitle']
    png = os.path.join(outdir, "qos.png")
    script = os.path.join(raw, "chart.gp")
    text = (f"""
set terminal pngcairo size 1400,560 noenhanced font ",10"
set output "{png}"
set datafile missing "?"
set multiplot layout 1,2
set title "A: 4k randread QD1, clat p99 (us): median, bars min-max over {reps} rep(s)"
set style fill solid 0.6 border -1
set boxwidth 0.6
set xrange [-0.6:{len(PHASES) - 0.4:g}]
set yrange [0:*]
set ylabel "us"
set grid ytics
plot "{lat}" using 1:3:xtic(2) with boxes lc rgb "steelblue" notitle, \\
     "" using 1:3:4:5 with yerrorbars lc rgb "black" pt 0 notitle
set title "B in the limited phase: write bandwidth per second (first {ramp_s:g} s excluded)"
set xrange [*:*]
set yrange [0:{top:.4f}]
set xtics auto
set xlabel "s"
set ylabel "MiB/s"
set key bottom right
plot {", ".join(series)}
unset multiplot
""")
    return gnuplot(script, text, png, "bench-qos-report")


if __name__ == "__main__":
    main()
