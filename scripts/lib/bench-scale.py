#!/usr/bin/env python3
"""Scale benchmark: many devices in one `glidefs serve` (issue 26). Runs where ublk is
(scripts/bench scale starts it inside scripts/ublk-vm). Standard library only; gnuplot for
the chart.

  bench-scale.py --bin GLIDEFS --out DIR [--devices N] [--step S] [--size SIZE]
                 [--jobs J] [--soft 1024] [--hard 65536] [--settle 15] [--tmpfs-mib M]
                 [--queue-threads T]

1. `glidefs serve` starts under `prlimit --nofile=SOFT:HARD` (a shell's 1024 at start; the
   daemon raises its soft limit to HARD itself and logs it) on the embedded local store, its
   data directory and store on a tmpfs of M MiB (default 3 per device + 1024: each volume's
   WAL segment reserves 2 records per block, 1 MiB for 64 MiB), so the VM needs memory for it. `[ublk] queue_threads` is T
   when given (0: a thread per queue), else the daemon's default (one per CPU).
2. N volumes (SIZE each, nothing written) are created through the CLI, J at a time; every S
   devices one sample: devices, the daemon's RSS, threads and open fds (/proc), elapsed; one
   more after SETTLE seconds idle (the blocking pool's threads for device steps idle out
   after 10 s), from which the cost per device is computed.
3. kill -9 of the daemon with all N devices up (they stay, QUIESCED); a new `serve` restores
   them: time until its API answers and until every volume is `running` again.
4. Every volume is removed, J at a time; samples as in 2, counting down.

Writes DIR/scale.json (parameters, kernel, samples, per-phase throughput, per-device cost
from the last create sample, restore time, failures) and DIR/scale.png (RSS, threads and
fds against devices). Exit 0 only when every device was created, restored and removed.
"""
import argparse
import concurrent.futures
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time


def log(msg):
    print(f"bench-scale: {msg}", flush=True)


def thread_names(pid):
    """How many threads of `pid` have each name, digits dropped (`ublk-q0-12` -> `ublk-q-`)."""
    names = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = "".join(c for c in f.read().strip() if not c.isdigit())
        except OSError:
            continue
        names[name] = names.get(name, 0) + 1
    return dict(sorted(names.items(), key=lambda kv: -kv[1]))


def proc_sample(pid):
    """RSS (KiB), threads and open fds of `pid`."""
    rss = threads = None
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1])
            elif line.startswith("Threads:"):
                threads = int(line.split()[1])
    return {"rss_kib": rss, "threads": threads, "fds": len(os.listdir(f"/proc/{pid}/fd"))}


class Daemon:
    def __init__(self, args, work):
        self.args, self.work = args, work
        self.sock = os.path.join(work, "api.sock")
        self.config = os.path.join(work, "glidefs.toml")
        with open(self.config, "w") as f:
            f.write(
                f'data_dir = "{work}/data"\n'
                f'[store]\nurl = "file://{work}/store"\n'
                f'[api]\nsocket = "{self.sock}"\n'
                "[volume_defaults]\nflush_interval_secs = 3600\n"
            )
            if args.queue_threads is not None:
                f.write(f"[ublk]\nqueue_threads = {args.queue_threads}\n")
        self.proc = None

    def start(self, name):
        if os.path.exists(self.sock):
            os.unlink(self.sock)
        logf = open(os.path.join(self.args.out, f"serve-{name}.log"), "w")
        env = dict(os.environ, GLIDEFS_LOG="info")
        self.proc = subprocess.Popen(
            ["prlimit", f"--nofile={self.args.soft}:{self.args.hard}", self.args.bin,
             "serve", "--config", self.config],
            stdout=logf, stderr=subprocess.STDOUT, env=env)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 3600:
            if self.proc.poll() is not None:
                raise SystemExit(f"bench-scale: serve exited {self.proc.returncode} (log: serve-{name}.log)")
            if os.path.exists(self.sock) and self.cli("volume", "list", check=False).returncode == 0:
                return time.monotonic() - t0
            time.sleep(0.05)
        raise SystemExit("bench-scale: serve did not answer within an hour")

    def cli(self, *args, check=True):
        r = subprocess.run([self.args.bin, *args, "--socket", self.sock],
                           capture_output=True, text=True)
        if check and r.returncode != 0:
            raise RuntimeError(f"glidefs {' '.join(args)}: {r.stderr.strip()}")
        return r

    def volumes(self):
        return json.loads(self.cli("volume", "list", "--json").stdout)["volumes"]


def run_many(jobs, names, fn):
    """fn(name) for every name, `jobs` at a time; yields (index, name, error or None)."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        futs = {pool.submit(fn, n): n for n in names}
        for i, fut in enumerate(concurrent.futures.as_completed(futs), 1):
            err = fut.exception()
            yield i, futs[fut], (str(err) if err else None)


def phase(d, names, fn, what, step, jobs, count_up):
    samples, failures = [], []
    t0 = time.monotonic()
    total = len(names)
    for i, name, err in run_many(jobs, names, fn):
        if err:
            failures.append(f"{what} {name}: {err}")
            if len(failures) <= 3:
                log(f"{what} {name} FAILED: {err}")
        if i % step == 0 or i == total:
            s = proc_sample(d.proc.pid)
            s.update(devices=i if count_up else total - i, elapsed_s=round(time.monotonic() - t0, 2), phase=what)
            samples.append(s)
            log(f"{what}: {i}/{total} in {s['elapsed_s']} s; rss {s['rss_kib'] // 1024} MiB, "
                f"{s['threads']} threads, {s['fds']} fds")
    secs = time.monotonic() - t0
    return samples, failures, secs


def plot(out, samples):
    if not shutil.which("gnuplot"):
        log("gnuplot not found: no chart")
        return
    data = os.path.join(out, "scale.dat")
    with open(data, "w") as f:
        for s in samples:
            if s["phase"] == "create":
                f.write(f"{s['devices']} {s['rss_kib'] / 1024:.1f} {s['threads']} {s['fds']}\n")
    script = f"""
set terminal pngcairo size 1100,600 noenhanced font ",10"
set output "{out}/scale.png"
set multiplot layout 1,3 title "glidefs serve: cost of devices (create phase)"
set xlabel "devices"; set grid
set title "RSS (MiB)"; plot "{data}" using 1:2 with linespoints notitle
set title "threads"; plot "{data}" using 1:3 with linespoints notitle
set title "open fds"; plot "{data}" using 1:4 with linespoints notitle
unset multiplot
"""
    subprocess.run(["gnuplot"], input=script, text=True, check=False)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--bin", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--devices", type=int, default=1000)
    p.add_argument("--step", type=int, default=100)
    p.add_argument("--size", default="64M")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--soft", type=int, default=1024)
    p.add_argument("--hard", type=int, default=65536)
    p.add_argument("--settle", type=int, default=15)
    p.add_argument("--tmpfs-mib", type=int, default=0)
    p.add_argument("--queue-threads", type=int, default=None)
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="glidefs-scale.")
    # The data directory and the store on a tmpfs of their own, sized for the volumes: each
    # volume's WAL segment reserves space (1 MiB at 64 MiB), and the guest's /tmp is too small.
    tmpfs_mib = args.tmpfs_mib or args.devices * 3 + 1024
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={tmpfs_mib}m", "tmpfs", work], check=True)
    log(f"work directory {work}: a tmpfs of {tmpfs_mib} MiB")
    names = [f"s{i:05d}" for i in range(args.devices)]
    d = Daemon(args, work)
    start_s = d.start("first")
    base = proc_sample(d.proc.pid)
    base.update(devices=0, elapsed_s=0, phase="create")
    log(f"serve up in {start_s:.2f} s: {base}")

    samples, failures, create_s = phase(
        d, names, lambda n: d.cli("volume", "create", n, "--size", args.size),
        "create", args.step, args.jobs, True)
    samples.insert(0, base)
    # Threads the blocking pool started for the device steps idle out after 10 s: the cost
    # per device is read after that.
    time.sleep(args.settle)
    settled = proc_sample(d.proc.pid)
    settled.update(devices=samples[-1]["devices"], elapsed_s=round(create_s + args.settle, 2), phase="settled",
                   thread_names=thread_names(d.proc.pid))
    samples.append(settled)
    log(f"after {args.settle} s idle: rss {settled['rss_kib'] // 1024} MiB, {settled['threads']} threads, {settled['fds']} fds; "
        f"threads by name: {settled['thread_names']}")
    up = d.volumes()
    transports = sorted({(v.get("device") or {}).get("transport") or "none" for v in up})
    queues = sorted({v.get("queues") for v in up if v.get("queues") is not None})
    last = samples[-1]
    n = max(last["devices"], 1)
    per_device = {
        "rss_kib": round((last["rss_kib"] - base["rss_kib"]) / n, 1),
        "threads": round((last["threads"] - base["threads"]) / n, 3),
        "fds": round((last["fds"] - base["fds"]) / n, 2),
    }
    log(f"{len(up)} volumes up ({transports}); per device: {per_device}")

    # kill -9 with every device up, then restore.
    d.proc.send_signal(signal.SIGKILL)
    d.proc.wait()
    t0 = time.monotonic()
    answered_s = d.start("restore")
    running = 0
    while time.monotonic() - t0 < 3600:
        vols = d.volumes()
        running = sum(1 for v in vols if v.get("state") == "running")
        # Done when every volume is running, or settled otherwise (failed: its reason is in
        # the failures below); a `recovering` one is still on its way.
        if running == len(up) or all(v.get("state") in ("running", "failed") for v in vols):
            break
        time.sleep(0.5)
    for v in vols:
        if v.get("state") != "running":
            failures.append(f"restore: {v['name']} is {v.get('state')}: {v.get('error')}")
    restore_s = time.monotonic() - t0
    if running != len(up):
        failures.append(f"restore: {running} of {len(up)} volumes running after {restore_s:.0f} s")
    after = proc_sample(d.proc.pid)
    log(f"restored {running}/{len(up)} after kill -9 in {restore_s:.1f} s (API answered after {answered_s:.1f} s)")

    rm_samples, rm_failures, remove_s = phase(
        d, [v["name"] for v in up], lambda n: d.cli("volume", "rm", n),
        "remove", args.step, args.jobs, False)
    samples += rm_samples
    failures += rm_failures
    left = d.volumes()
    if left:
        failures.append(f"{len(left)} volumes left after removing all")
    d.proc.send_signal(signal.SIGTERM)
    d.proc.wait(timeout=600)

    result = {
        "kernel": os.uname().release,
        "cpus": os.cpu_count(),
        "parameters": vars(args),
        "transports": transports,
        "queues_per_device": queues,
        "created": len(up),
        "create": {"seconds": round(create_s, 2), "per_second": round(len(up) / create_s, 2) if create_s else None},
        "restore_after_kill9": {"seconds": round(restore_s, 2), "api_answered_s": round(answered_s, 2),
                                "running": running, "sample": after},
        "remove": {"seconds": round(remove_s, 2), "per_second": round(len(up) / remove_s, 2) if remove_s else None},
        "per_device": per_device,
        "samples": samples,
        "failures": failures,
    }
    with open(os.path.join(args.out, "scale.json"), "w") as f:
        json.dump(result, f, indent=1)
    plot(args.out, samples)
    subprocess.run(["umount", work], check=False)
    shutil.rmtree(work, ignore_errors=True)
    summary = {k: result[k] for k in ("created", "create", "remove", "per_device", "transports")}
    summary["restore_s"] = result["restore_after_kill9"]["seconds"]
    print(json.dumps(summary))
    if failures:
        log(f"{len(failures)} failures: {failures[:5]}")
        sys.exit(1)


if __name__ == "__main__":
    main()
