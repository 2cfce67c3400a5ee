#!/usr/bin/env python3
"""scripts/lib/bench-plan.py [bench-compare's options]: the plan of scripts/bench-compare.

bench-compare (bash) starts and stops the targets and runs fio; what to run, in what order,
and for how long is computed here. Standard library only (python3 >= 3.11).

Checks the options (as bench-compare documents them: --runtime --reps --size --quick
--keep-dirty --fs --workloads --numjobs --unsigned-payload --queue-threads --store-latency
--baseline --memory --timeout --no-build --estimate), applies the --quick defaults and the --workloads
filter, plans the run, estimates its time in the VM, and prints shell assignments for
bench-compare to eval:
  params_env     the text of RAWDIR/params.env (the run's parameters: sourced in the VM,
                 read by scripts/lib/bench-report.py into compare.json)
  plan           the text of RAWDIR/plan (below)
  cache_fs build estimate_only
  memory timeout_s   the VM's (--memory / --timeout, else derived from the size and the
                 estimate)
  estimate_s     the estimated seconds in the VM
  estimate_line  the line bench-compare prints (jobs per rep, estimated minutes)
Bad options: the usage (bench-compare's header) or an error on stderr, exit 2.

The plan: the steps of the run, one a line, in order:
  bytes SIZE_BYTES BLOCKS      first: --size in bytes and in glidefs blocks
  begin REP PHASE              a phase of rep REP starts (hot, cold, flush)
  settle REP KEY               flush (and gc) the hot volume of glidefs-KEY (zc, uc; with
                               --baseline also zc-base, uc-base) before its next job; absent
                               with --keep-dirty
  job REP MODE TARGET LABEL RW BS QD NJ
                               one fio job: MODE hot (time_based) or cold (one pass), TARGET,
                               workload LABEL = fio --rw RW --bs BS, iodepth QD, numjobs NJ
  flush REP TARGET             the flush measurement of TARGET
  end REP PHASE                the phase is done
Per rep: the hot phase (per workload, QD and numjobs, every hot target one after another:
reps are interleaved across targets, so drift hits all alike), the cold phase
(glidefs-zc-cold, glidefs-uc-cold, then s3backer for its workloads), the flush phase. The
plan lists every target; bench-compare skips those that are not available.
"""
import os
import re
import shlex
import sys

# The targets, in the order they run within a job (scripts/lib/bench-report.py: HOT, COLD).
HOT_TARGETS = ["loop", "null-zc", "null-uc", "rublk-loop", "rublk-loop-zc", "glidefs-zc",
               "glidefs-uc"]
GLIDEFS_KEYS = ["zc", "uc"]  # glidefs-KEY: the zero-copy and the USER_COPY daemon
# --baseline BIN: two more daemons, the same two transports, run by a glidefs binary built at
# another commit (glidefs-zc-base, glidefs-uc-base), right after glidefs-zc and glidefs-uc in
# every job: a before/after comparison measured in one run.
BASE_KEYS = ["zc-base", "uc-base"]
# workload label -> fio --rw, --bs
WORKLOADS = {
    "randread4k": ("randread", "4k"),
    "randwrite4k": ("randwrite", "4k"),
    "randrw4k": ("randrw", "4k"),
    "seqread128k": ("read", "128k"),
    "seqwrite128k": ("write", "128k"),
}
COLD_WORKLOADS = ["randread4k", "seqread128k"]
S3BACKER_WORKLOADS = ["seqread128k"]
# glidefs's block size here, and s3backer's --blockSize (they must match to compare).
BLOCK_SIZE = "128K"
PARAMS = ["runtime", "ramp", "reps", "size", "qds", "njs", "hot_workloads", "cold_workloads",
          "s3b_workloads", "block_size", "quick", "keep_dirty", "cache_fs", "unsigned_payload", "queue_threads",
          "store_latency", "baseline", "glidefs_keys"]
QUOTED = {"qds", "njs", "hot_workloads", "cold_workloads", "s3b_workloads", "baseline",
          "glidefs_keys"}


def usage():
    """bench-compare's header (its lines 2 up to `set -euo`) on stderr, exit 2."""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench-compare")) as f:
        lines = f.read().splitlines()[1:]
    for line in lines:
        if line.startswith("set -euo"):
            break
        print(re.sub(r"^# ?", "", line), file=sys.stderr)
    sys.exit(2)


def fail(msg):
    print(f"bench-compare: {msg}", file=sys.stderr)
    sys.exit(2)


def to_bytes(size):
    """64M -> bytes (K/M/G binary, either case; no suffix: bytes)."""
    m = {"k": 2**10, "m": 2**20, "g": 2**30}.get(size[-1:].lower(), 1)
    return int(size[:-1] if m > 1 else size) * m


def parse_options(argv):
    """bench-compare's options -> (params, host): params as params.env has them (strings),
    host the options that only the host uses."""
    o = {"runtime": "5", "reps": "3", "size": "256M", "memory": "", "timeout": "",
         "fs": "xfs", "workloads": "", "numjobs": "", "unsigned-payload": "auto",
         "queue-threads": "", "store-latency": "0", "baseline": ""}
    flags = {"quick": False, "no-build": False, "keep-dirty": False, "estimate": False}
    given = set()
    args = list(argv)
    while args:
        a = args.pop(0)
        name = a[2:] if a.startswith("--") else None
        if name in flags:
            flags[name] = True
        elif name in o and args:
            o[name] = args.pop(0)
            given.add(name)
        else:
            usage()
    ramp, njs = "1", "1 4"
    if flags["quick"]:
        for k, v in (("runtime", "1"), ("reps", "1"), ("size", "64M")):
            if k not in given:
                o[k] = v
        ramp, njs = "0", "1"
    if o["numjobs"]:
        njs = " ".join(o["numjobs"].replace(",", " ").split())
        if not re.fullmatch(r"[1-9][0-9]*( [1-9][0-9]*)*", njs):
            fail(f"--numjobs must be whole numbers >= 1, not '{o['numjobs']}'")
    if not re.fullmatch(r"[1-9][0-9]*", o["runtime"]):
        fail("--runtime must be whole seconds >= 1")
    if o["fs"] not in ("xfs", "ext4"):
        fail(f"--fs must be xfs or ext4, not '{o['fs']}'")
    if o["unsigned-payload"] not in ("auto", "on", "off"):
        fail(f"--unsigned-payload must be auto, on or off, not '{o['unsigned-payload']}'")
    if o["queue-threads"] and not re.fullmatch(r"[0-9]+", o["queue-threads"]):
        fail(f"--queue-threads must be a whole number (0: a thread per queue), not '{o['queue-threads']}'")
    if not re.fullmatch(r"[0-9]+", o["store-latency"]) or int(o["store-latency"]) > 1000:
        fail(f"--store-latency must be whole milliseconds 0..1000, not '{o['store-latency']}'")
    if not re.fullmatch(r"[1-9][0-9]*", o["reps"]):
        fail("--reps must be >= 1")
    if not re.fullmatch(r"[1-9][0-9]*[KMG]", o["size"]) or to_bytes(o["size"]) % (4 * 2**20):
        fail("--size must be a multiple of 4M with a K/M/G suffix, e.g. 256M")
    baseline = o["baseline"]
    if baseline:
        baseline = os.path.abspath(baseline)
        if not (os.path.isfile(baseline) and os.access(baseline, os.X_OK)):
            fail(f"--baseline must be an executable glidefs binary, not '{o['baseline']}'")
        if re.search(r'[\s"$`\\]', baseline):
            fail(f"--baseline: a path without spaces or shell quoting characters, not '{baseline}'")
    keys = GLIDEFS_KEYS + (BASE_KEYS if baseline else [])
    hot, cold, s3b = list(WORKLOADS), COLD_WORKLOADS, S3BACKER_WORKLOADS
    only = o["workloads"]
    if only:
        for w in only.replace(",", " ").split():
            if w not in hot:
                fail(f"unknown workload '{w}' (known: {' '.join(hot)})")
        # (as a test of ",LIST," for ",WORKLOAD,": the order stays the default's)
        hot, cold, s3b = ([w for w in ws if f",{w}," in f",{only},"] for ws in (hot, cold, s3b))
    params = {
        "runtime": o["runtime"], "ramp": ramp, "reps": o["reps"], "size": o["size"],
        "qds": "1 32", "njs": njs, "hot_workloads": " ".join(hot),
        "cold_workloads": " ".join(cold), "s3b_workloads": " ".join(s3b),
        "block_size": BLOCK_SIZE, "quick": str(int(flags["quick"])),
        "keep_dirty": str(int(flags["keep-dirty"])), "cache_fs": o["fs"],
        "unsigned_payload": o["unsigned-payload"], "queue_threads": o["queue-threads"],
        "store_latency": o["store-latency"], "baseline": baseline,
        "glidefs_keys": " ".join(keys),
    }
    host = {"memory": o["memory"], "timeout_s": o["timeout"],
            "build": str(int(not flags["no-build"])),
            "estimate_only": str(int(flags["estimate"]))}
    return params, host


def params_env(params):
    """The text of params.env (shell: sourced in the VM; bench-report.py reads it too)."""
    return "".join(f'{k}="{params[k]}"\n' if k in QUOTED else f"{k}={params[k]}\n" for k in PARAMS)


def plan(params):
    """The run's steps, as tuples of words (see `jobs` in the module docstring)."""
    qds, njs = params["qds"].split(), params["njs"].split()
    hot, cold = params["hot_workloads"].split(), params["cold_workloads"].split()
    s3b = params["s3b_workloads"].split()
    keep_dirty = params["keep_dirty"] == "1"
    keys = params["glidefs_keys"].split()
    base_targets = [f"glidefs-{k}" for k in keys if k not in GLIDEFS_KEYS]
    hot_targets = HOT_TARGETS + base_targets
    size_b = to_bytes(params["size"])
    steps = [("bytes", size_b, size_b // to_bytes(params["block_size"]))]
    for rep in range(1, int(params["reps"]) + 1):
        # with a baseline, even reps run it first: neither binary always follows the other
        order = hot_targets
        if base_targets and rep % 2 == 0:
            order = [t for t in hot_targets if not t.startswith("glidefs-")] + base_targets + [
                t for t in hot_targets if t.startswith("glidefs-") and t not in base_targets]
        steps.append(("begin", rep, "hot"))
        for label in hot:
            for qd in qds:
                for nj in njs:
                    for target in order:
                        if target.startswith("glidefs-") and not keep_dirty:
                            steps.append(("settle", rep, target.removeprefix("glidefs-")))
                        steps.append(("job", rep, "hot", target, label, *WORKLOADS[label], qd, nj))
        steps.append(("end", rep, "hot"))
        steps.append(("begin", rep, "cold"))
        for label in cold:
            for qd in qds:
                for nj in njs:
                    for key in keys:
                        steps.append(("job", rep, "cold", f"glidefs-{key}-cold", label,
                                      *WORKLOADS[label], qd, nj))
                    if label in s3b:
                        steps.append(("job", rep, "cold", "s3backer", label, *WORKLOADS[label],
                                      qd, nj))
        steps.append(("end", rep, "cold"))
        steps.append(("begin", rep, "flush"))
        for key in keys:
            steps.append(("flush", rep, f"glidefs-{key}"))
        steps.append(("flush", rep, "s3backer"))
        steps.append(("end", rep, "flush"))
    return steps


def estimate(params, steps):
    """Estimated seconds in the VM, from the step costs measured under QEMU TCG (2 vCPUs,
    --quick run): a hot job costs ~1.5 s beyond its runtime (fio start/stop, samples); a
    cold glidefs job ~9 s (attach, show, remove); an s3backer (re)mount ~4 s; glidefs writes
    ~45 MiB/s and flushes ~15 MiB/s to the in-VM S3 server (so settling a volume a write job
    dirtied costs ~SIZE/15 s + 3 s of gc); s3backer writes ~17 MiB/s and drains ~16 MiB/s.
    Returns (seconds, jobs per rep)."""
    runtime, ramp, reps = int(params["runtime"]), int(params["ramp"]), int(params["reps"])
    size_mib = to_bytes(params["size"]) // 2**20
    combos = len(params["qds"].split()) * len(params["njs"].split())
    rep1 = [s for s in steps if s[0] == "job" and s[1] == 1]
    hot_jobs = sum(1 for s in rep1 if s[2] == "hot")
    cold_jobs = sum(1 for s in rep1 if s[2] == "cold" and s[3] != "s3backer")
    s3b_jobs = sum(1 for s in rep1 if s[3] == "s3backer")
    daemons = len(params["glidefs_keys"].split())
    settle_s = 0 if params["keep_dirty"] == "1" else daemons * combos * (3 * (size_mib // 15 + 3) + 2)
    flush_s = daemons * (size_mib // 45 + size_mib // 15 + 5) + size_mib // 17 + size_mib // 16 + 4
    per_rep = (hot_jobs * (runtime * 2 + 3 + ramp * 2) // 2 + settle_s
               + cold_jobs * (runtime + 9) + s3b_jobs * (runtime + 4) + flush_s)
    setup = (90 + 2 * daemons * (size_mib // 45 + size_mib // 15) + 3 * size_mib // 100 + size_mib // 17
             + size_mib // 16)
    return setup + reps * per_rep, hot_jobs + cold_jobs + s3b_jobs


def main():
    params, host = parse_options(sys.argv[1:])
    steps = plan(params)
    est, jobs = estimate(params, steps)
    size_mib = to_bytes(params["size"]) // 2**20
    out = {
        "params_env": params_env(params),
        "plan": "".join(" ".join(str(w) for w in step) + "\n" for step in steps),
        "cache_fs": params["cache_fs"],
        "build": host["build"],
        "estimate_only": host["estimate_only"],
        # RAM disk (files, caches: a hot glidefs volume holds up to 2 x SIZE) + tmpfs (the
        # S3 server's data, ~6 x SIZE) + page cache: ~20 x SIZE, + 2G
        "memory": host["memory"] or f"{(size_mib * 20 + 1023) // 1024 + 2}G",
        "timeout_s": host["timeout_s"] or str(est * 2 + 1200),
        "estimate_s": str(est),
        "estimate_line": (f"bench-compare: runtime {params['runtime']}s, ramp {params['ramp']}s, "
                          f"reps {params['reps']}, size {params['size']}, QD {{{params['qds']}}}, "
                          f"numjobs {{{params['njs']}}}: {jobs} jobs per rep, estimated "
                          f"{est // 60} min in the VM"),
    }
    for k, v in out.items():
        print(f"{k}={shlex.quote(v)}")


if __name__ == "__main__":
    main()
