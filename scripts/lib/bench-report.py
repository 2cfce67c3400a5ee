#!/usr/bin/env python3
"""scripts/lib/bench-report.py RAWDIR OUTDIR: the analysis half of `scripts/bench compare`.

Reads what scripts/lib/bench-compare left in RAWDIR (params.env, targets.jsonl, samples.jsonl,
one fio JSON per target, job and rep: TARGET.JOB.qdQ.njN.rREP.json; not plan, the steps
scripts/lib/bench-plan.py planned) and writes
  OUTDIR/compare.json   medians with min/max over the reps, per-rep samples, ratios
  OUTDIR/compare.md     the tables (ratios, absolute figures, QD1 latency, cold reads,
                        flush, daemon CPU and RSS)
  OUTDIR/compare-*.png  bar charts (gnuplot; skipped with a note when it is missing)
Ratios are ratios of the medians; their spread is the min/max of the per-rep ratios (the
targets of one rep ran back to back). Standard library only.
"""

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time

from bench_raw import read_jsonl, read_params, spread

WORKLOADS = ["randread4k", "randwrite4k", "randrw4k", "seqread128k", "seqwrite128k"]
HOT = ["loop", "null-zc", "null-uc", "rublk-loop", "rublk-loop-zc", "glidefs-zc", "glidefs-uc"]
COLD = ["glidefs-zc-cold", "glidefs-uc-cold", "s3backer"]
DAEMONS = ["glidefs-zc", "glidefs-uc", "null-zc", "null-uc", "rublk-loop", "rublk-loop-zc"]
# (column title, numerator, denominator) for the hot-cache ratio table and chart
RATIOS = [
    ("glidefs-zc / loop", "glidefs-zc", "loop"),
    ("glidefs-zc / null-zc", "glidefs-zc", "null-zc"),
    ("glidefs-zc / rublk-loop-zc", "glidefs-zc", "rublk-loop-zc"),
    ("glidefs-zc / glidefs-uc", "glidefs-zc", "glidefs-uc"),
]
KEYS = ["zc", "uc"]  # the glidefs daemons: glidefs-KEY (hot), glidefs-KEY-cold
# `--baseline BIN`: the same daemons run by a binary built at another commit (KEY-base)
BASE_KEYS = ["zc-base", "uc-base"]


def include_baseline(targets):
    """With --baseline (its targets in targets.jsonl), the baseline daemons join the tables
    beside the current ones; the before/after ratios are computed by baseline_ratios."""
    if "glidefs-zc-base" not in targets:
        return False
    KEYS.extend(BASE_KEYS)
    HOT.extend(f"glidefs-{k}" for k in BASE_KEYS)
    COLD[-1:-1] = [f"glidefs-{k}-cold" for k in BASE_KEYS]
    DAEMONS[2:2] = [f"glidefs-{k}" for k in BASE_KEYS]
    return True
MIB = 2**20
GIB = 2**30


def die(msg):
    sys.exit(f"bench-report: {msg}")




def is_throughput(job):
    """128k jobs are read as MiB/s, 4k jobs as IOPS."""
    return "128k" in job


def lat_side(workload):
    return "write" if "write" in workload and "rw" not in workload else "read"


def parse_fio(path):
    with open(path) as fh:
        text = fh.read()
    try:
        j = json.loads(text[text.index("{"):])
        job = j["jobs"][0]
    except (ValueError, KeyError, IndexError):
        return None
    if job.get("error"):
        return None
    r, w = job["read"], job["write"]
    workload = os.path.basename(path).split(".")[1]
    side = job[lat_side(workload)]
    pct = side["clat_ns"].get("percentile", {})
    return {
        "iops": r["iops"] + w["iops"],
        "mib_s": (r["bw_bytes"] + w["bw_bytes"]) / MIB,
        "lat_p50_us": pct.get("50.000000", 0) / 1000,
        "lat_p99_us": pct.get("99.000000", 0) / 1000,
        "lat_mean_us": side["clat_ns"]["mean"] / 1000,
        "io_bytes": r["io_bytes"] + w["io_bytes"],
    }



def main():
    if len(sys.argv) != 3:
        die("usage: bench-report.py RAWDIR OUTDIR")
    raw, outdir = sys.argv[1], sys.argv[2]
    params = read_params(raw)
    targets = {}
    for t in read_jsonl(os.path.join(raw, "targets.jsonl")):
        targets[t["target"]] = t
    samples = read_jsonl(os.path.join(raw, "samples.jsonl"))
    has_baseline = include_baseline(targets)
    kernel = open(os.path.join(raw, "kernel")).read().strip() if os.path.exists(
        os.path.join(raw, "kernel")) else "unknown"
    reps = int(params.get("reps", "1"))
    qds = params.get("qds", "1 32").split()
    njs = params.get("njs", "1").split()
    jobs = [f"{w}.qd{q}.nj{n}" for w in WORKLOADS for q in qds for n in njs]

    fio_samples = {(s["target"], s["job"], s["rep"]): s for s in samples if s["kind"] == "fio"}

    # per (target, job): per-rep values
    per_rep = {}
    for path in sorted(glob.glob(os.path.join(raw, "*.json"))):
        m = re.match(r"^(.+)\.([a-z0-9]+)\.qd(\d+)\.nj(\d+)\.r(\d+)\.json$", os.path.basename(path))
        if not m:
            continue
        target, wl, q, n, rep = m.group(1), m.group(2), m.group(3), m.group(4), int(m.group(5))
        job = f"{wl}.qd{q}.nj{n}"
        r = parse_fio(path)
        if r is None:
            continue
        s = fio_samples.get((target, job, rep), {})
        moved = s.get("dev_bytes") or r["io_bytes"]
        if s.get("cpu_ticks") is not None and moved:
            r["cpu_s_per_gib"] = s["cpu_ticks"] / s["clk_tck"] / (moved / GIB)
        if s.get("rss_kb") is not None:
            r["rss_mib"] = s["rss_kb"] / 1024
        r["rep"] = rep
        per_rep.setdefault(target, {}).setdefault(job, []).append(r)

    metrics = ["iops", "mib_s", "lat_p50_us", "lat_p99_us", "lat_mean_us", "cpu_s_per_gib", "rss_mib"]
    results = {}
    for target, by_job in per_rep.items():
        for job, runs in by_job.items():
            results.setdefault(target, {})[job] = {
                k: spread([r.get(k) for r in runs]) for k in metrics if any(k in r for r in runs)}

    def med(target, job, key="iops"):
        v = results.get(target, {}).get(job, {}).get(key)
        return v["median"] if v else None

    def ratio(num, den, job, key="iops"):
        a, b = med(num, job, key), med(den, job, key)
        if not a or not b:
            return None
        by_rep_a = {r["rep"]: r[key] for r in per_rep.get(num, {}).get(job, [])}
        by_rep_b = {r["rep"]: r[key] for r in per_rep.get(den, {}).get(job, [])}
        per = [by_rep_a[k] / by_rep_b[k] for k in by_rep_a if k in by_rep_b and by_rep_b[k]]
        return {"ratio": a / b, "min": min(per) if per else None, "max": max(per) if per else None}

    ratios = {}
    for job in jobs:
        for title, a, b in RATIOS:
            r = ratio(a, b, job)
            if r:
                ratios.setdefault(job, {})[title] = r
    cold_jobs = [j for j in jobs if j.split(".")[0] in ("randread4k", "seqread128k")]
    cold_ratios = {}
    for job in cold_jobs:
        for key in KEYS:
            r = ratio(f"glidefs-{key}-cold", "s3backer", job)
            if r:
                cold_ratios.setdefault(job, {})[f"glidefs-{key}-cold / s3backer"] = r

    # flush
    flush = {}
    for s in samples:
        if s["kind"] != "flush":
            continue
        mib = s["bytes"] / MIB
        row = {
            "write_mib_s": mib / s["write_s"] if s["write_s"] else None,
            "flush_mib_s": mib / s["flush_s"] if s["flush_s"] else None,
            "write_flush_mib_s": mib / (s["write_s"] + s["flush_s"]),
            "flush_s": s["flush_s"],
            "uploaded_mib_s": (s["uploaded_bytes"] / MIB / s["flush_s"])
            if s.get("uploaded_bytes") is not None and s["flush_s"] else None,
            "uploaded_mib": s["uploaded_bytes"] / MIB if s.get("uploaded_bytes") is not None else None,
            "cpu_s_per_gib": (s["cpu_ticks"] / s["clk_tck"] / (s["bytes"] / GIB))
            if s.get("cpu_ticks") is not None else None,
            "rep": s["rep"],
        }
        flush.setdefault(s["target"], []).append(row)
    flush_summary = {
        t: {k: spread([r[k] for r in rows]) for k in rows[0] if k != "rep"}
        for t, rows in flush.items()
    }

    def flush_ratio(num, den, key="write_flush_mib_s"):
        a, b = flush_summary.get(num), flush_summary.get(den)
        if not (a and b and a.get(key) and b.get(key)):
            return None
        ra = {r["rep"]: r[key] for r in flush[num]}
        rb = {r["rep"]: r[key] for r in flush[den]}
        per = [ra[k] / rb[k] for k in ra if k in rb and rb[k]]
        return {"ratio": a[key]["median"] / b[key]["median"],
                "min": min(per) if per else None, "max": max(per) if per else None}

    flush_ratios = {}
    for key in KEYS:
        r = flush_ratio(f"glidefs-{key}", "s3backer")
        if r:
            flush_ratios[f"glidefs-{key} / s3backer (write+flush)"] = r

    # --baseline: the current binary against the baseline, per daemon (> 1: current faster)
    base = {}
    if has_baseline:
        for key in ("zc", "uc"):
            now, then = f"glidefs-{key}", f"glidefs-{key}-base"
            for job in jobs:
                for suffix in ("", "-cold"):
                    r = ratio(now + suffix, then + suffix, job)
                    if r:
                        base.setdefault(job + (" (cold)" if suffix else ""), {})[f"{now} / {then}"] = r
            for k in ("write_mib_s", "flush_mib_s", "write_flush_mib_s"):
                r = flush_ratio(now, then, k)
                if r:
                    base.setdefault(f"flush: {k}", {})[f"{now} / {then}"] = r

    attach = spread([s["wall_s"] for s in samples if s["kind"] == "attach"])
    daemon_end = {s["target"]: s for s in samples if s["kind"] == "daemon"}
    rss = {}
    for t in (f"glidefs-{k}" for k in KEYS):
        vals = [s["rss_kb"] / 1024 for s in samples
                if s["kind"] == "fio" and s["target"] in (t, t + "-cold") and s.get("rss_kb")]
        if vals:
            rss[t] = {"max_mib": max(vals), "min_mib": min(vals),
                      "end_mib": daemon_end.get(t, {}).get("rss_kb", 0) / 1024,
                      "peak_hwm_mib": daemon_end.get(t, {}).get("hwm_kb", 0) / 1024}

    doc = {
        "benchmark": "side-by-side comparison (scripts/bench compare)",
        "raw": raw,
        "complete": not os.path.exists(os.path.join(raw, "failed")),
        "environment": f"QEMU TCG guest via scripts/ublk-vm, 2 vCPUs, kernel {kernel}: absolute "
                       "numbers are far below native hardware; compare ratios measured in the same run",
        "generated": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "params": params,
        "targets": targets,
        "metric_note": "iops/mib_s: read+write; latency: fio clat percentiles of the read side "
                       "(write side for randwrite/seqwrite); cpu_s_per_gib: the target process's "
                       "utime+stime over the job / bytes through the device",
        "results": results,
        "ratios_iops": ratios,
        "cold_ratios_iops": cold_ratios,
        "flush": flush_summary,
        "flush_ratios": flush_ratios,
        "baseline": params.get("baseline") or None,
        "baseline_ratios": base,
        "cold_attach_s": attach,
        "daemon_rss_mib": rss,
        "runs": per_rep,
        "flush_runs": flush,
    }
    os.makedirs(outdir, exist_ok=True)
    with open(os.path.join(outdir, "compare.json"), "w") as fh:
        json.dump(doc, fh, indent=2, sort_keys=False)

    charts = write_charts(raw, outdir, jobs, ratios, results)
    md = markdown(doc, jobs, cold_jobs, reps, charts)
    with open(os.path.join(outdir, "compare.md"), "w") as fh:
        fh.write(md)
    print(md)
    print(f"wrote {os.path.join(outdir, 'compare.json')}, compare.md"
          + "".join(f", {c}" for c in charts))


# ------------------------------------------------------------------------------ Markdown

def fmt(v, digits=None):
    if v is None:
        return "–"
    if digits is None:
        digits = 0 if abs(v) >= 100 else 1 if abs(v) >= 10 else 2
    return f"{v:,.{digits}f}"


def cell(s, digits=None, spread_shown=True):
    if not s:
        return "–"
    if not spread_shown or s["n"] < 2:
        return fmt(s["median"], digits)
    return f"{fmt(s['median'], digits)} ({fmt(s['min'], digits)}–{fmt(s['max'], digits)})"


def rcell(r):
    if not r:
        return "–"
    if r.get("min") is None or r["min"] == r["max"]:
        return f"**{r['ratio']:.2f}**"
    return f"**{r['ratio']:.2f}** ({r['min']:.2f}–{r['max']:.2f})"


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * len(header)) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out) + "\n"


def job_title(job):
    wl, q, n = job.split(".")
    return f"{wl} {q.upper()} {n.replace('nj', 'jobs=')}"


def queue_threads_note(n):
    """How the glidefs daemons served their queues (`--queue-threads`)."""
    if n == "":
        return (", glidefs queues as by default (a thread each for the first queues, up to "
                "one per CPU, the shared pool for the rest)")
    if n == "0":
        return ", glidefs queues on a thread each"
    return f", glidefs queues on a shared pool of {n} threads"


def store_latency_note(ms):
    """The S3 server's added latency per request (`--store-latency`)."""
    if ms in ("", "0"):
        return ""
    return f", every S3 request delayed {ms} ms (a remote store's latency)"


def markdown(doc, jobs, cold_jobs, reps, charts):
    p, targets, res = doc["params"], doc["targets"], doc["results"]

    def val(t, job):
        key = "mib_s" if is_throughput(job) else "iops"
        return res.get(t, {}).get(job, {}).get(key)

    L = []
    L.append("# glidefs side by side\n")
    L.append(f"Generated {doc['generated']} by `scripts/bench compare`"
             f"{' --quick' if p.get('quick') == '1' else ''}. {doc['environment']}.\n")
    L.append(f"fio: io_uring, O_DIRECT, {p.get('runtime')} s per job"
             f"{', ramp ' + p.get('ramp') + ' s' if p.get('ramp', '0') != '0' else ''}, "
             f"time_based (cold jobs: at most one pass), QD {{{p.get('qds')}}} x numjobs "
             f"{{{p.get('njs')}}} (jobs on disjoint ranges), randrw 50/50, volume/file size "
             f"{p.get('size')}, glidefs block size {p.get('block_size')}, files and caches on "
             f"{p.get('cache_fs', 'ext4')} on a RAM disk, S3 PUT bodies "
             f"{'unsigned' if p.get('unsigned_payload') == 'on' else 'SHA-256 signed (http)'}"
             f"{queue_threads_note(p.get('queue_threads', ''))}"
             f"{store_latency_note(p.get('store_latency', ''))}. Each figure: median of "
             f"{reps} rep{'s' if reps != 1 else ''} (min–max), reps interleaved across targets. "
             "4k jobs in IOPS, 128k jobs in MiB/s.\n")
    failed = os.path.join(doc["raw"], "failed")
    if os.path.exists(failed):
        L.append(f"> **Incomplete**: the VM part failed (exit {open(failed).read().strip()}); "
                 "these are the jobs it finished.\n")
    if reps < 3:
        L.append(f"> Only {reps} rep{'s' if reps != 1 else ''}: a development run, not a "
                 "measurement (use >= 3).\n")

    L.append("## Targets\n")
    rows = []
    for t in HOT + COLD:
        i = targets.get(t)
        if not i:
            rows.append([f"`{t}`", "–", "not set up", "–"])
            continue
        rows.append([f"`{t}`", i.get("transport") or "–", i.get("detail", ""),
                     "yes" if i.get("available") else "**no**"])
    L.append(table(["target", "transport", "setup", "available"], rows))

    if doc["baseline_ratios"]:
        L.append("## Before/after: this binary against `--baseline`\n")
        L.append(f"Baseline binary: `{doc['baseline']}`, run by its own two daemons "
                 "(glidefs-zc-base, glidefs-uc-base) beside the current binary's in every rep, "
                 "set up alike. Ratio of medians (min–max of the per-rep ratios); > 1: the "
                 "current binary is faster. Hot and cold jobs: IOPS (4k) or MiB/s (128k); "
                 "flush: MiB/s.\n")
        cols = ["glidefs-zc / glidefs-zc-base", "glidefs-uc / glidefs-uc-base"]
        rows = [[j if j.startswith("flush") else job_title(j)]
                + [rcell(r.get(c)) for c in cols] for j, r in doc["baseline_ratios"].items()]
        L.append(table(["job"] + cols, rows))

    L.append("## Hot cache: glidefs zero-copy against the others\n")
    L.append("Ratio of medians (min–max of the per-rep ratios); > 1: glidefs-zc is faster. "
             + ("The glidefs volumes were not flushed between jobs (`--keep-dirty`): after its "
                "first write a block stays dirty, so writes take the hot path."
                if p.get("keep_dirty") == "1" else
                "Before every job the glidefs volumes were flushed (not timed), so each job starts "
                "with all blocks clean, as after a background flush: the first write to a clean "
                "block copies the whole block (" + p.get("block_size", "?") + ") into the active "
                "cache file.") + "\n")
    rows = []
    for job in jobs:
        r = doc["ratios_iops"].get(job, {})
        rows.append([job_title(job), cell(val("glidefs-zc", job))] + [rcell(r.get(t)) for t, _, _ in RATIOS])
    L.append(table(["job", "glidefs-zc"] + [t for t, _, _ in RATIOS], rows))

    L.append("## Absolute figures\n")
    rows = [[job_title(job)] + [cell(val(t, job)) for t in HOT] for job in jobs]
    L.append(table(["job"] + HOT, rows))

    L.append("## QD1 latency: clat p50 / p99 (µs)\n")
    L.append("Read side for randrw.\n")
    rows = []
    for job in jobs:
        if ".qd1." not in job:
            continue
        row = [job_title(job)]
        for t in HOT:
            r = res.get(t, {}).get(job, {})
            if r.get("lat_p50_us"):
                row.append(f"{fmt(r['lat_p50_us']['median'])} / {fmt(r['lat_p99_us']['median'])}")
            else:
                row.append("–")
        rows.append(row)
    L.append(table(["job"] + HOT, rows))

    L.append("## Cold reads (every job on a freshly attached volume / fresh s3backer mount)\n")
    L.append("glidefs: `volume create --attach-existing` before each job, so every block comes "
             "from the object store once; s3backer: re-mounted (empty block cache) before each "
             f"job, seq read only. Attach took {cell(doc['cold_attach_s'], 2)} s.\n")
    rows = []
    for job in cold_jobs:
        r = doc["cold_ratios_iops"].get(job, {})
        rows.append([job_title(job)] + [cell(val(t, job)) for t in COLD]
                    + [rcell(r.get("glidefs-zc-cold / s3backer")), rcell(r.get("glidefs-uc-cold / s3backer"))])
    L.append(table(["job"] + COLD + ["glidefs-zc-cold / s3backer", "glidefs-uc-cold / s3backer"], rows))

    L.append("## Flush to the object store\n")
    L.append(f"A fresh volume (s3backer: its file) gets {p.get('size')} written (128k seq, QD32), "
             "then glidefs: `glidefs volume flush` is timed; s3backer: the time until its block "
             "cache has no dirty block (it uploads during the write already). MiB/s of data "
             "written; uploaded: bytes the flush report says it uploaded (after compression) per "
             "second; CPU: the daemon's during the flush per GiB written.\n")
    rows = []
    for t in [f"glidefs-{k}" for k in KEYS] + ["s3backer"]:
        f = doc["flush"].get(t)
        if not f:
            rows.append([f"`{t}`"] + ["–"] * 6)
            continue
        rows.append([f"`{t}`", cell(f["write_mib_s"]), cell(f["flush_mib_s"]), cell(f["write_flush_mib_s"]),
                     cell(f.get("uploaded_mib_s")), cell(f.get("flush_s"), 2), cell(f.get("cpu_s_per_gib"), 2)])
    L.append(table(["target", "write MiB/s", "flush MiB/s", "write+flush MiB/s", "uploaded MiB/s",
                    "flush s", "CPU s/GiB"], rows))
    if doc["flush_ratios"]:
        L.append("".join(f"- {title}: {rcell(r)}\n" for title, r in doc["flush_ratios"].items()))

    L.append("## Daemon CPU per GiB moved (s of utime+stime / GiB through the device)\n")
    daemons = [t for t in DAEMONS if t in res]
    rows = [[job_title(job)] + [cell(res.get(t, {}).get(job, {}).get("cpu_s_per_gib"), 2) for t in daemons]
            for job in jobs]
    rows += [[job_title(job) + " (cold)"] + [
        cell(res.get(t + "-cold", {}).get(job, {}).get("cpu_s_per_gib"), 2) if t.startswith("glidefs") else "–"
        for t in daemons] for job in cold_jobs]
    L.append(table(["job"] + daemons, rows))
    L.append("## Daemon RSS (MiB)\n")
    rows = [[f"`{t}`", fmt(v["min_mib"]), fmt(v["max_mib"]), fmt(v["end_mib"]), fmt(v["peak_hwm_mib"])]
            for t, v in doc["daemon_rss_mib"].items()]
    L.append(table(["daemon", "min after a job", "max after a job", "at the end", "peak (VmHWM)"], rows))

    if charts:
        L.append("## Charts\n")
        for c in charts:
            L.append(f"![{c}]({c})\n")
    else:
        L.append("(no charts: gnuplot not installed)\n")
    return "\n".join(L)


# -------------------------------------------------------------------------------- charts

def write_charts(raw, outdir, jobs, ratios, results):
    if not shutil.which("gnuplot"):
        print("bench-report: gnuplot not found: no charts", file=sys.stderr)
        return []
    charts = []
    # 1. hot-cache ratios, one cluster per job
    # (columns per series: ratio of medians, min and max of the per-rep ratios)
    dat = os.path.join(raw, "chart-ratios.dat")
    with open(dat, "w") as fh:
        for job in jobs:
            vals = []
            for t, _, _ in RATIOS:
                r = ratios.get(job, {}).get(t)
                if r:
                    lo = r["min"] if r.get("min") is not None else r["ratio"]
                    hi = r["max"] if r.get("max") is not None else r["ratio"]
                    vals += [f"{r['ratio']:.4f}", f"{lo:.4f}", f"{hi:.4f}"]
                else:
                    vals += ["?", "?", "?"]
            fh.write(f'"{job_title(job)}" ' + " ".join(vals) + "\n")
    series = ", ".join(
        f'"{dat}" using {2 + 3 * i}:{3 + 3 * i}:{4 + 3 * i}' + (":xtic(1)" if i == 0 else "")
        + f' title "{t}"' for i, (t, _, _) in enumerate(RATIOS))
    png = "compare-ratios.png"
    plot(os.path.join(raw, "chart-ratios.gp"), f"""
set terminal pngcairo size {max(900, 80 * len(jobs) + 200)},640 noenhanced font ",10"
set output "{os.path.join(outdir, png)}"
set title "glidefs zero-copy, hot cache: IOPS ratio to each target (ratio of medians, bars: min-max of the per-rep ratios; > 1 = glidefs faster)"
set datafile missing "?"
set style data histograms
set style histogram errorbars gap 1 lw 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set key outside bottom center horizontal
set xtics rotate by 35 right
set logscale y 2
set ylabel "ratio (log scale)"
set grid ytics
set arrow from graph 0, first 1 to graph 1, first 1 nohead lw 2 lc rgb "black"
plot {series}
""")
    charts.append(png)

    # 2. QD1 latency p99, numjobs 1, per workload and target (none without numjobs 1)
    lat_jobs = [j for j in jobs if ".qd1.nj1" in j]
    if not lat_jobs:
        return charts
    dat = os.path.join(raw, "chart-latency.dat")
    with open(dat, "w") as fh:
        fh.write("job " + " ".join(f'"{t}"' for t in HOT) + "\n")
        for job in lat_jobs:
            vals = []
            for t in HOT:
                v = results.get(t, {}).get(job, {}).get("lat_p99_us")
                vals.append(f"{v['median']:.2f}" if v and v["median"] else "?")
            fh.write(f'"{job.split(".")[0]}" ' + " ".join(vals) + "\n")
    png = "compare-latency.png"
    plot(os.path.join(raw, "chart-latency.gp"), f"""
set terminal pngcairo size 1100,600 noenhanced font ",10"
set output "{os.path.join(outdir, png)}"
set title "QD1, one job: completion latency p99 (µs, median over reps; lower is better)"
set datafile missing "?"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set key outside bottom center horizontal
set bmargin 6
set logscale y 10
set ylabel "µs (log scale)"
set grid ytics
plot for [i=2:{len(HOT) + 1}] "{dat}" using i:xtic(1) title columnhead(i)
""")
    charts.append(png)
    return charts


def plot(script, text):
    with open(script, "w") as fh:
        fh.write(text)
    r = subprocess.run(["gnuplot", script], capture_output=True, text=True)
    if r.returncode != 0:
        die(f"gnuplot {script} failed: {r.stderr}")


if __name__ == "__main__":
    main()
