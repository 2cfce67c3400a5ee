#!/usr/bin/env python3
"""scripts/lib/soak-report.py: the sampler and the report of scripts/fio-soak.

fio-soak (bash) starts the processes (S3 server, `glidefs serve`, the gc reaper, fio) and
runs this program twice, inside the VM: `sample` for the whole run, `finish` at the end.
Standard library only (python3 >= 3.11); gnuplot for the chart.

  sample CSV SOCK DAEMON_PID S3_PID STORE_DIR DATA_DIR INTERVAL DURATION STOP_FILE T0_FILE
         DRAIN_LIMIT END_DIR
      Every INTERVAL s, one row to CSV (columns: COLUMNS below) and a progress line to
      stdout: the daemon's RSS, open fds (sockets among them), threads and CPU seconds
      (/proc/DAEMON_PID), the S3 server's RSS and CPU seconds; summed over the volumes from
      the API on SOCK (GET /v1/volumes): dirty, syncing and cache bytes, flushes (count,
      bytes, errors), cold reads, volumes running, flush lag (the largest flush.lag_secs);
      from GET /metrics: read cache misses and I/O bytes; the store's size and object count
      (the tree STORE_DIR) and the bytes used on the cache file system (DATA_DIR). Phase
      `idle` until T0_FILE (fio's start, unix seconds) exists, `load` until STOP_FILE (fio
      is done) exists, then `drain`: a row every 2 s until nothing is left to flush and the
      daemon's sockets are back to their first sample's count + 1 (or DRAIN_LIMIT s
      passed); that row is `end`, and its GET /v1/volumes and /metrics bodies go to
      END_DIR/volumes-end.json and END_DIR/metrics-end.txt. DURATION is for the progress
      line only.
  finish OUT [--devices N --duration S ... (the soak's parameters: see finish_args)]
      Writes OUT/meta.json (the soak's parameters, fio's exit codes, hangs, the daemon's
      exit status on SIGTERM; kernel, CPUs and memory of this machine), then `summary` and
      `plot`. Exit 0 when every check passed, 1 otherwise (or when plotting failed).
  summary OUT META
      Reads OUT/samples.csv, META (meta.json), OUT/fio/soakI.json and .log (fio's JSON
      output and stderr per device), OUT/volumes-end.json, OUT/metrics-end.txt and
      OUT/gc/*.json (`glidefs gc --json` per reaper run; a failed run leaves .out and .err);
      writes OUT/summary.json (fields: summary_cmd; `failures` lists every failed check,
      `passed` is true when there is none) and prints a summary. Exit 0 or 1 as `finish`.
  plot OUT
      Reads OUT/samples.csv and OUT/summary.json; writes OUT/samples.dat and OUT/soak.png
      (gnuplot: RSS, fds, unflushed data, flush lag, store and cache size, throughput).

Checks (each failure is a line of summary.json `failures`), N = the number of devices:
  - RSS growth: end - start and max - start <= 256 MiB + 8 MiB * N. Start: the first row
    with a daemon (volumes up, fio not started); end: the `end` row;
  - fds: end <= start + 8 + 4 * N (both rows of an idle daemon);
  - drained: the `end` row has no dirty or syncing bytes (else: unflushed data left);
  - fio, per device: a result, both jobs (writer, reader) present, no job error, each job
    ran at least DURATION - 2 s, exit status 0, some bytes verified; no verify error
    (fio's total_err of the writer, or verify lines in its log) over all devices; no hang;
  - space (with --space-bound X): the store (every object) stays <= X times the live data
    (the frames the manifests map: GET /v1/volumes `space.live_bytes`) in every sample of
    the second half of the load (summary.json `space`; the plot's store panel shows both);
  - the daemon at the end: every volume running, at least one flush and one cold read,
    no device I/O error, no flush error and no failed gc run (both only without
    --store-faults), and exit status 0 after SIGTERM.
"""
import argparse
import csv
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import time

def api(sock, path, timeout=20):
    class Conn(http.client.HTTPConnection):
        def connect(self):
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(timeout)
            self.sock.connect(sock)
    c = Conn("localhost", timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        body = r.read().decode()
        if r.status != 200:
            raise RuntimeError(f"GET {path}: {r.status} {body[:200]}")
        return body
    finally:
        c.close()

def proc_status(pid):
    st = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                st[k] = v.split()[0] if v.split() else ""
    except OSError:
        return None
    return st

TICK = os.sysconf("SC_CLK_TCK")

def cpu_s(pid):
    """User + system CPU seconds of a process ('' when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return f"{(int(fields[11]) + int(fields[12])) / TICK:.2f}"
    except (OSError, IndexError, ValueError):
        return ""

def fds(pid):
    """Open fds of `pid` and the sockets among them. An fd listed but closed before its
    readlink is not counted at all: the store client closes its idle connections together,
    and counting those as open non-socket fds made an end row (the first with the sockets
    closed again) read up to the number of connections too high."""
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None, None
    total = sockets = 0
    for fd in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed since the listing
        total += 1
        if target.startswith("socket:"):
            sockets += 1
    return total, sockets

def tree(dir):
    size = n = 0
    for d, _, files in os.walk(dir):
        for f in files:
            try:
                size += os.lstat(os.path.join(d, f)).st_size
                n += 1
            except OSError:
                pass
    return size, n

METRIC = re.compile(r'^(glidefs_volume_[a-z_]+)\{([^}]*)\} ([0-9.e+-]+)$')

def metric_sums(text):
    """Sums of every per-volume series by (name, op) over the volumes."""
    sums = {}
    for line in text.splitlines():
        m = METRIC.match(line)
        if not m:
            continue
        name, labels, value = m.groups()
        if name.endswith("_bucket"):
            continue
        op = re.search(r'op="([a-z_]+)"', labels)
        key = name + (":" + op.group(1) if op else "")
        sums[key] = sums.get(key, 0.0) + float(value)
    return sums

COLUMNS = ["t_s", "phase", "unix", "rss_kib", "fds", "fds_sockets", "threads", "cpu_s", "dirty_bytes",
           "syncing_bytes", "cache_bytes", "cache_fs_used_bytes", "flush_lag_s", "flushes",
           "flush_bytes", "flush_errors", "cold_reads", "read_misses", "write_bytes",
           "read_bytes", "store_bytes", "store_objects", "s3_rss_kib", "s3_cpu_s",
           "volumes_running", "api_ms", "live_bytes", "compacted_bytes"]

def mib(b):
    return f"{b / 2**20:.1f}M"

def sample_cmd(csv_path, sock, daemon_pid, s3_pid, store_dir, data_dir, interval, duration,
               stop_file, t0_file, drain_limit, end_dir):
    """Samples until `stop_file` appears (fio is done), then drains: samples every 2 s until
    the volumes have nothing left to flush and the store connections are back to where they
    were before the load (or `drain_limit` s passed); that last sample is the end, whose
    GET /v1/volumes and /metrics go to `end_dir` (volumes-end.json, metrics-end.txt)."""
    interval, duration, drain_limit = float(interval), int(duration), float(drain_limit)
    f = open(csv_path, "w", newline="")
    w = csv.writer(f)
    w.writerow(COLUMNS)
    t0 = None
    first = None
    drain_since = None
    while True:
        now = time.time()
        if drain_since is None and os.path.exists(stop_file):
            drain_since = now
        if t0 is None and os.path.exists(t0_file):
            t0 = float(open(t0_file).read())
        row = {c: "" for c in COLUMNS}
        row["unix"] = f"{now:.1f}"
        row["t_s"] = f"{now - t0:.1f}" if t0 is not None else "0.0"
        row["phase"] = "idle" if t0 is None else ("load" if drain_since is None else "drain")
        st = proc_status(daemon_pid)
        if st:
            row["rss_kib"] = st.get("VmRSS", "")
            row["threads"] = st.get("Threads", "")
            row["cpu_s"] = cpu_s(daemon_pid)
        total, socks = fds(daemon_pid)
        row["fds"], row["fds_sockets"] = ("" if total is None else total), ("" if socks is None else socks)
        s3 = proc_status(s3_pid)
        if s3:
            row["s3_rss_kib"] = s3.get("VmRSS", "")
            row["s3_cpu_s"] = cpu_s(s3_pid)
        try:
            a = time.time()
            vols_text, metrics_text = api(sock, "/v1/volumes"), api(sock, "/metrics")
            vols = json.loads(vols_text)["volumes"]
            sums = metric_sums(metrics_text)
            row["api_ms"] = f"{(time.time() - a) * 1000:.0f}"
            row["dirty_bytes"] = sum(v["dirty_bytes"] for v in vols)
            row["syncing_bytes"] = sum(v["syncing_bytes"] for v in vols)
            row["cache_bytes"] = sum(v["cache_bytes"] for v in vols)
            row["flush_lag_s"] = f'{max([v["flush"]["lag_secs"] for v in vols] or [0]):.1f}'
            row["flushes"] = sum(v["flush"]["count"] for v in vols)
            row["flush_bytes"] = sum(v["flush"]["bytes"] for v in vols)
            row["flush_errors"] = sum(v["flush"]["errors"] for v in vols)
            row["cold_reads"] = sum(v["cold_reads"] for v in vols)
            row["volumes_running"] = sum(1 for v in vols if v["state"] == "running")
            row["live_bytes"] = sum(v.get("space", {}).get("live_bytes", 0) for v in vols)
            row["compacted_bytes"] = sum(v.get("space", {}).get("compacted_bytes", 0) for v in vols)
            row["read_misses"] = int(sums.get("glidefs_volume_read_cache_misses_total", 0))
            row["write_bytes"] = int(sums.get("glidefs_volume_io_bytes_total:write", 0))
            row["read_bytes"] = int(sums.get("glidefs_volume_io_bytes_total:read", 0))
        except Exception as e:  # the API not answering is itself a finding: logged, sampled empty
            print(f"fio-soak: sample at {row['t_s']}s: API: {e}", flush=True)
        row["store_bytes"], row["store_objects"] = tree(store_dir)
        vfs = os.statvfs(data_dir)
        row["cache_fs_used_bytes"] = (vfs.f_blocks - vfs.f_bfree) * vfs.f_frsize
        if first is None and row["rss_kib"] != "":
            first = row
        done = False
        if drain_since is not None:
            drained = (row["dirty_bytes"] == 0 and row["syncing_bytes"] == 0 and first is not None
                       and row["fds_sockets"] != "" and row["fds_sockets"] <= first["fds_sockets"] + 1)
            done = drained or now - drain_since >= drain_limit or row["rss_kib"] == ""
            if done:
                row["phase"] = "end"
                if row["api_ms"] != "":
                    open(os.path.join(end_dir, "volumes-end.json"), "w").write(vols_text)
                    open(os.path.join(end_dir, "metrics-end.txt"), "w").write(metrics_text)
                print(f"fio-soak: {'drained' if drained else 'NOT drained'} {now - drain_since:.0f}s after fio ended", flush=True)
        w.writerow([row[c] for c in COLUMNS])
        f.flush()
        if row["rss_kib"] != "" and first is not None:
            drss = (int(row["rss_kib"]) - int(first["rss_kib"])) / 1024
            lag = row["flush_lag_s"] or "?"
            print(f"fio-soak: [{float(row['t_s']):5.0f}/{duration}s] rss {int(row['rss_kib'])/1024:.1f}M "
                  f"({drss:+.1f}M) fds {row['fds']} dirty {mib(row['dirty_bytes'] or 0)} lag {lag}s "
                  f"flushes {row['flushes']} cold {row['cold_reads']} w {mib(row['write_bytes'] or 0)} "
                  f"store {mib(row['store_bytes'])}", flush=True)
        else:
            print(f"fio-soak: [{row['t_s']}s] daemon gone", flush=True)
        if done:
            break
        # Sleep to the next tick (2 s while draining), waking early when fio is done.
        end = now + (interval if drain_since is None else 2)
        while time.time() < end and (drain_since is not None or not os.path.exists(stop_file)):
            time.sleep(0.2)
    f.close()

def load_fio(path):
    text = open(path).read()
    return json.loads(text[text.index("{"):])

def summary_cmd(out, meta_path):
    meta = json.load(open(meta_path))
    n, duration = meta["devices"], meta["duration_s"]
    rows = list(csv.DictReader(open(os.path.join(out, "samples.csv"))))
    good = [r for r in rows if r["rss_kib"] != ""]
    fails = []
    def num(r, k):
        return float(r[k]) if r.get(k) not in (None, "") else 0.0
    s = {"devices": n, "duration_s": duration, "kernel": meta["kernel"],
         "transport": meta.get("transports"), "config": meta["config"], "vm": meta.get("vm"),
         "started_unix": meta.get("started_unix"), "samples": len(rows)}
    if good:
        start, end = good[0], good[-1]
        rss = [int(r["rss_kib"]) for r in good]
        fd = [int(r["fds"]) for r in good if r["fds"] != ""]
        s["rss_kib"] = {"start": rss[0], "end": rss[-1], "max": max(rss)}
        s["fds"] = {"start": fd[0], "end": fd[-1], "max": max(fd),
                    "sockets_start": int(start["fds_sockets"]), "sockets_end": int(end["fds_sockets"]),
                    "sockets_max": max(int(r["fds_sockets"]) for r in good)}
        s["threads"] = {"start": int(start["threads"]), "end": int(end["threads"]),
                        "max": max(int(r["threads"]) for r in good)}
        lag = [num(r, "flush_lag_s") for r in good if r["flush_lag_s"] != ""]
        dirty = [num(r, "dirty_bytes") + num(r, "syncing_bytes") for r in good if r["dirty_bytes"] != ""]
        s["flush_lag_s"] = {"max": max(lag or [0]), "mean": sum(lag) / len(lag) if lag else 0}
        s["dirty_plus_syncing_bytes"] = {"max": max(dirty or [0]), "mean": sum(dirty) / len(dirty) if dirty else 0}
        s["store_bytes"] = {"end": int(end["store_bytes"]), "max": max(int(r["store_bytes"]) for r in rows)}
        s["store_objects"] = {"end": int(end["store_objects"]), "max": max(int(r["store_objects"]) for r in rows)}
        s["cache_fs_used_bytes_max"] = max(int(r["cache_fs_used_bytes"]) for r in rows)
        s["cpu_s"] = {"daemon": num(end, "cpu_s") - num(start, "cpu_s"),
                      "s3_server": num(end, "s3_cpu_s") - num(start, "s3_cpu_s")}
        s3rss = [int(r["s3_rss_kib"]) for r in rows if r["s3_rss_kib"] != ""]
        if s3rss:
            s["s3_server_rss_kib"] = {"start": s3rss[0], "end": s3rss[-1], "max": max(s3rss)}
        budget = (256 + 8 * n) * 1024
        slack = 8 + 4 * n
        s["budgets"] = {"rss_growth_kib": budget, "fd_slack": slack}
        s["drained"] = end["phase"] == "end" and num(end, "dirty_bytes") + num(end, "syncing_bytes") == 0
        if not s["drained"]:
            fails.append("the volumes still had unflushed data 120 s after fio ended")
        if rss[-1] - rss[0] > budget:
            fails.append(f"RSS grew {(rss[-1] - rss[0]) / 1024:.1f} MiB from start to end (budget {budget / 1024:.0f} MiB)")
        if max(rss) - rss[0] > budget:
            fails.append(f"RSS peaked {(max(rss) - rss[0]) / 1024:.1f} MiB over its start (budget {budget / 1024:.0f} MiB)")
        if fd[-1] > fd[0] + slack:
            fails.append(f"fds: {fd[-1]} at the end, {fd[0]} at the start (slack {slack})")
    else:
        fails.append("no sample of the daemon")
    # space: the store (all objects) against the live data the manifests map
    load = [r for r in good if r["phase"] == "load" and num(r, "live_bytes") > 0]
    if load:
        late = load[len(load) // 2:]
        ratio = lambda r: num(r, "store_bytes") / num(r, "live_bytes")
        last = load[-1]
        bound = meta["config"].get("space_bound")
        s["space"] = {"working_set": meta["config"].get("working_set") or None,
                      "compact_interval_s": meta["config"].get("compact_interval_s"),
                      "compact_threshold_pct": meta["config"].get("compact_threshold_pct"),
                      "live_bytes_end": int(num(last, "live_bytes")),
                      "store_bytes_end": int(num(last, "store_bytes")),
                      "store_per_live_end": round(ratio(last), 3),
                      "store_per_live_max_second_half": round(max(ratio(r) for r in late), 3),
                      "compacted_bytes": int(num(good[-1], "compacted_bytes")),
                      "bound": bound}
        if bound and s["space"]["store_per_live_max_second_half"] > bound:
            fails.append(f"the store reached {s['space']['store_per_live_max_second_half']}x the live "
                         f"data in the second half of the load (bound {bound}x)")
    elif meta["config"].get("space_bound"):
        fails.append("no sample of the live data during the load")
    # fio
    per_dev, verify_errors, tot_w, tot_v, tot_r = {}, 0, 0, 0, 0
    for i in range(n):
        path = os.path.join(out, "fio", f"soak{i}.json")
        errlog = os.path.join(out, "fio", f"soak{i}.log")
        err_text = open(errlog).read() if os.path.exists(errlog) else ""
        verify_lines = sum(1 for l in err_text.splitlines() if "verify" in l.lower() and ("bad" in l or "fail" in l.lower()))
        rc = meta["fio_rc"].get(f"soak{i}")
        d = {"fio_rc": rc, "verify_error_lines": verify_lines}
        try:
            jobs = {j["jobname"]: j for j in load_fio(path)["jobs"]}
        except Exception as e:
            fails.append(f"soak{i}: no fio result ({e}); fio exit {rc}")
            per_dev[f"soak{i}"] = d
            continue
        wj, rj = jobs.get("writer"), jobs.get("reader")
        d["bytes_written"] = wj["write"]["io_bytes"] if wj else 0
        d["bytes_verified"] = wj["read"]["io_bytes"] if wj else 0
        d["bytes_read_unverified"] = rj["read"]["io_bytes"] if rj else 0
        d["write_iops"] = round(wj["write"]["iops"], 1) if wj else 0
        d["read_iops"] = round(rj["read"]["iops"], 1) if rj else 0
        d["verify_errors"] = (wj.get("total_err", 0) if wj else 0)
        if d["verify_errors"] == 0 and verify_lines:
            d["verify_errors"] = verify_lines
        d["jobs"] = {name: {"error": j["error"], "runtime_ms": j["job_runtime"],
                            "total_err": j.get("total_err", 0), "first_error": j.get("first_error", 0)}
                     for name, j in jobs.items()}
        verify_errors += d["verify_errors"]
        tot_w += d["bytes_written"]
        tot_v += d["bytes_verified"]
        tot_r += d["bytes_read_unverified"]
        for name, j in jobs.items():
            if j["error"] != 0:
                fails.append(f"soak{i} fio job {name}: error {j['error']}")
            if j["job_runtime"] < duration * 1000 - 2000:
                fails.append(f"soak{i} fio job {name}: ran {j['job_runtime'] / 1000:.1f}s of {duration}s")
        for name in ("writer", "reader"):
            if name not in jobs:
                fails.append(f"soak{i}: fio job {name} missing")
        if rc != 0:
            fails.append(f"soak{i}: fio exited {rc}")
        if d["bytes_verified"] == 0:
            fails.append(f"soak{i}: no bytes verified")
        per_dev[f"soak{i}"] = d
    if verify_errors:
        fails.append(f"{verify_errors} fio verify errors (see fio/*.log)")
    s["fio"] = {"per_device": per_dev, "bytes_written": tot_w, "bytes_verified": tot_v,
                "bytes_read_unverified": tot_r, "verify_errors": verify_errors,
                "write_bytes_per_s": round(tot_w / duration) if duration else 0}
    for h in meta.get("hangs", []):
        fails.append(f"hang: {h}")
    # daemon figures at the end
    try:
        vols = json.load(open(os.path.join(out, "volumes-end.json")))["volumes"]
        sums = metric_sums(open(os.path.join(out, "metrics-end.txt")).read())
        s["flushes"] = sum(v["flush"]["count"] for v in vols)
        s["flush_bytes"] = sum(v["flush"]["bytes"] for v in vols)
        s["flush_errors"] = sum(v["flush"]["errors"] for v in vols)
        s["cold_reads"] = sum(v["cold_reads"] for v in vols)
        s["metrics"] = {k: int(sums.get(k, 0)) for k in (
            "glidefs_volume_blocks_fetched_total", "glidefs_volume_read_cache_misses_total",
            "glidefs_volume_read_cache_hits_total", "glidefs_volume_cold_read_bytes_total",
            "glidefs_volume_fetches_coalesced_total", "glidefs_volume_readahead_total",
            "glidefs_volume_packs_uploaded_total", "glidefs_volume_io_errors_total:read",
            "glidefs_volume_io_errors_total:write", "glidefs_volume_io_bytes_total:read",
            "glidefs_volume_io_bytes_total:write")}
        s["volumes"] = {v["name"]: {"state": v["state"], "flushes": v["flush"]["count"],
                                    "flush_errors": v["flush"]["errors"], "cold_reads": v["cold_reads"],
                                    "manifest_generation": v["manifest_generation"],
                                    "last_flush_error": v["flush"]["last_error"]} for v in vols}
        for v in vols:
            if v["state"] != "running":
                fails.append(f"volume {v['name']} is {v['state']}: {v.get('error')}")
        if s["flushes"] == 0:
            fails.append("no flush ran")
        if s["flush_errors"] and not meta.get("store_faults"):
            fails.append(f"{s['flush_errors']} flush errors")
        if s["cold_reads"] == 0:
            fails.append("no cold read (no block was fetched from the store)")
        io_err = s["metrics"]["glidefs_volume_io_errors_total:read"] + s["metrics"]["glidefs_volume_io_errors_total:write"]
        if io_err:
            fails.append(f"{io_err} device I/O errors")
    except Exception as e:
        fails.append(f"no end state of the daemon ({e})")
    # gc
    runs = failed = packs = freed = 0
    gc_errors = []
    gcdir = os.path.join(out, "gc")
    for name in sorted(os.listdir(gcdir)) if os.path.isdir(gcdir) else []:
        if name.endswith(".out"):
            # fio-soak renames a run's .out to .json only when `glidefs gc` exited 0.
            runs += 1
            failed += 1
            err = os.path.join(gcdir, name[:-4] + ".err")
            try:
                tail = open(err).read().strip().splitlines()[-3:]
            except OSError as e:
                tail = [f"(no {os.path.basename(err)}: {e})"]
            gc_errors.append(f"gc run {name[:-4]}: " + (" | ".join(tail) or "(empty stderr)"))
            continue
        if not name.endswith(".json"):
            continue
        runs += 1
        try:
            for r in json.load(open(os.path.join(gcdir, name))):
                packs += r["packs_deleted"]
                freed += r["bytes_deleted"]
        except Exception:
            failed += 1
    s["gc"] = {"runs": runs, "failed": failed, "errors": gc_errors, "packs_deleted": packs, "bytes_deleted": freed,
               "interval_s": meta["gc_interval_s"], "grace_s": meta["config"]["gc_grace_s"]}
    if failed and not meta.get("store_faults"):
        fails.append(f"{failed} of {runs} gc runs failed: " + "; ".join(gc_errors))
    s["store_faults"] = meta.get("store_faults") or None
    s["daemon_exit"] = meta.get("daemon_exit")
    if meta.get("daemon_exit") != 0:
        fails.append(f"the daemon exited {meta.get('daemon_exit')} after SIGTERM (want 0)")
    s["failures"] = fails
    s["passed"] = not fails
    json.dump(s, open(os.path.join(out, "summary.json"), "w"), indent=2)
    m = lambda k: f"{k / 1024:.1f} MiB"
    print("fio-soak: summary")
    if good:
        print(f"  rss: start {m(s['rss_kib']['start'])}, end {m(s['rss_kib']['end'])}, max {m(s['rss_kib']['max'])}")
        print(f"  fds: start {s['fds']['start']}, end {s['fds']['end']}, max {s['fds']['max']}")
        print(f"  flush lag max {s['flush_lag_s']['max']:.1f}s, dirty+syncing max {s['dirty_plus_syncing_bytes']['max'] / 2**20:.1f} MiB, store end {s['store_bytes']['end'] / 2**20:.1f} MiB (max {s['store_bytes']['max'] / 2**20:.1f})")
    print(f"  fio: written {tot_w / 2**20:.1f} MiB, verified {tot_v / 2**20:.1f} MiB, read {tot_r / 2**20:.1f} MiB, verify errors {verify_errors}")
    print(f"  flushes {s.get('flushes')}, cold reads {s.get('cold_reads')}, gc runs {runs} ({failed} failed, {packs} packs deleted)")
    if "space" in s:
        sp = s["space"]
        print(f"  space: store {sp['store_bytes_end'] / 2**20:.1f} MiB for {sp['live_bytes_end'] / 2**20:.1f} MiB live "
              f"({sp['store_per_live_end']}x; max {sp['store_per_live_max_second_half']}x in the second half), "
              f"compaction copied {sp['compacted_bytes'] / 2**20:.1f} MiB")
    print(f"  kernel {s['kernel']}, transport {'/'.join(s['transport'] or [])}")
    for f_ in fails:
        print(f"  FAIL: {f_}")
    return 0 if not fails else 1

def plot_cmd(out):
    rows = list(csv.DictReader(open(os.path.join(out, "samples.csv"))))
    dat = os.path.join(out, "samples.dat")
    prev = None
    with open(dat, "w") as f:
        for r in rows:
            if r["rss_kib"] == "":
                continue
            t = float(r["t_s"])
            wr = rd = 0.0
            if prev and r["write_bytes"] != "" and prev[1]["write_bytes"] != "" and t > prev[0]:
                wr = (float(r["write_bytes"]) - float(prev[1]["write_bytes"])) / (t - prev[0]) / 2**20
                rd = (float(r["read_bytes"]) - float(prev[1]["read_bytes"])) / (t - prev[0]) / 2**20
            prev = (t, r)
            v = lambda k: r[k] if r[k] != "" else "NaN"
            mibv = lambda k: f"{float(r[k]) / 2**20:.3f}" if r[k] != "" else "NaN"
            kib = lambda k: f"{float(r[k]) / 1024:.3f}" if r[k] != "" else "NaN"
            f.write(" ".join([f"{t:.1f}", kib("rss_kib"), v("fds"), v("fds_sockets"),
                              mibv("dirty_bytes"), mibv("syncing_bytes"), v("flush_lag_s"),
                              mibv("store_bytes"), kib("s3_rss_kib"), f"{wr:.3f}", f"{rd:.3f}",
                              mibv("cache_fs_used_bytes"), mibv("live_bytes")]) + "\n")
    meta = json.load(open(os.path.join(out, "summary.json")))
    title = (f"glidefs fio soak: {meta['devices']} device(s), {meta['duration_s']} s, "
             f"kernel {meta['kernel']}, {'/'.join(meta['transport'] or [])}")
    gp = f"""
set terminal pngcairo size 1400,1000 font ",10"
set output "{os.path.join(out, 'soak.png')}"
set multiplot layout 3,2 title "{title}"
set grid
set key top left
set xlabel "time (s)"
set ylabel "MiB"
set title "daemon RSS"
plot "{dat}" using 1:2 with lines lw 2 title "glidefs RSS", "" using 1:9 with lines title "S3 server RSS"
set ylabel "count"
set title "daemon open fds"
plot "{dat}" using 1:3 with lines lw 2 title "all fds", "" using 1:4 with lines title "sockets"
set ylabel "MiB"
set title "unflushed data (sum over volumes)"
plot "{dat}" using 1:5 with lines lw 2 title "dirty", "" using 1:6 with lines title "syncing"
set ylabel "s"
set title "flush lag (max over volumes: age of the oldest data not in the store)"
plot "{dat}" using 1:7 with lines lw 2 title "flush lag"
set ylabel "MiB"
set title "store size vs live data, and cache size"
plot "{dat}" using 1:8 with lines lw 2 title "S3 store", "" using 1:13 with lines lw 2 title "live data (manifests)", "" using 1:12 with lines title "cache filesystem used"
set ylabel "MiB/s"
set title "device throughput (all volumes)"
plot "{dat}" using 1:10 with lines title "write", "" using 1:11 with lines title "read"
unset multiplot
"""
    subprocess.run(["gnuplot"], input=gp.encode(), check=True)


def write_meta(out, a):
    """OUT/meta.json: the soak's parameters and what the bash side saw (fio exit codes,
    hangs, the daemon's exit status); `summary` reads it."""
    with open("/proc/meminfo") as f:
        mem_mib = next(int(l.split()[1]) // 1024 for l in f if l.startswith("MemTotal:"))
    rcs = [int(x) for x in a.fio_rc.split()]
    meta = {
        "devices": a.devices, "duration_s": a.duration, "kernel": os.uname().release,
        "transports": sorted(set(a.transports.split())),
        "vm": {"cpus": len(os.sched_getaffinity(0)), "mem_mib": mem_mib},
        "started_unix": float(a.started),
        "config": {"size": a.size, "block_size": a.block_size, "flush_threshold": a.flush_threshold,
                   "flush_interval_s": a.flush_interval, "disk_budget": a.disk_budget,
                   "gc_grace_s": a.gc_grace, "sample_s": a.sample, "verify_backlog": a.verify_backlog,
                   "write_rate_bytes_s": a.write_rate, "read_rate_bytes_s": a.read_rate,
                   "cache_fs": a.cache_fs, "store_fs": "tmpfs",
                   "working_set": a.working_set, "compact_interval_s": a.compact_interval,
                   "compact_threshold_pct": a.compact_threshold,
                   "space_bound": float(a.space_bound) if a.space_bound else None},
        "store_faults": a.store_faults,
        "gc_interval_s": a.gc_interval,
        "fio_rc": {f"soak{i}": rc for i, rc in enumerate(rcs)},
        "hangs": a.hang,
        "daemon_exit": int(a.daemon_exit) if a.daemon_exit.lstrip("-").isdigit() else a.daemon_exit,
    }
    path = os.path.join(out, "meta.json")
    with open(path, "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    return path

def finish_args(p):
    """The options of `finish` (strings as given to fio-soak unless typed int)."""
    p.add_argument("out")
    for name in ("devices", "duration", "flush-interval", "gc-grace", "gc-interval", "sample",
                 "verify-backlog", "write-rate", "read-rate"):
        p.add_argument(f"--{name}", type=int, required=True)
    p.add_argument("--compact-interval", type=int, default=0)
    p.add_argument("--compact-threshold", type=int, default=50)
    p.add_argument("--working-set", default="", help="fio's region per device ('' = all; pass it as --working-set=...)")
    p.add_argument("--space-bound", default="", help="store/live bound ('' = none; pass it as --space-bound=...)")
    for name in ("size", "block-size", "flush-threshold", "disk-budget", "cache-fs", "started"):
        p.add_argument(f"--{name}", required=True)
    p.add_argument("--transports", default="", help="the volumes' transports, space-separated")
    p.add_argument("--store-faults", default="", help="fio-soak's --store-faults (pass it as --store-faults=...)")
    p.add_argument("--fio-rc", default="", help="fio's exit status per device, space-separated")
    p.add_argument("--hang", action="append", default=[], help="a hang (repeatable; pass it as --hang=...)")
    p.add_argument("--daemon-exit", required=True, help="the daemon's exit status, or 'timeout'")

def main():
    p = argparse.ArgumentParser(prog="soak-report.py", description="the sampler and report of scripts/fio-soak")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sample")
    for name in ("csv_path", "sock", "daemon_pid", "s3_pid", "store_dir", "data_dir", "interval",
                 "duration", "stop_file", "t0_file", "drain_limit", "end_dir"):
        s.add_argument(name)
    s = sub.add_parser("summary")
    s.add_argument("out")
    s.add_argument("meta_path")
    sub.add_parser("plot").add_argument("out")
    finish_args(sub.add_parser("finish"))
    a = vars(p.parse_args())
    cmd = a.pop("cmd")
    if cmd == "sample":
        sample_cmd(**a)
    elif cmd == "summary":
        sys.exit(summary_cmd(**a))
    elif cmd == "plot":
        plot_cmd(**a)
    elif cmd == "finish":
        args = argparse.Namespace(**a)
        rc = summary_cmd(args.out, write_meta(args.out, args))
        try:
            plot_cmd(args.out)
        except Exception as e:
            print(f"fio-soak: plotting failed: {e}")
            rc = 1
        sys.exit(rc)

if __name__ == "__main__":
    main()
