"""What the benchmark reports share (scripts/lib/bench-report.py, bench-qos-report.py): the
raw directory's `params.env` and JSON-lines samples, and the median/min/max of a figure over
the reps. Standard library only."""

import json
import os
import re
import shutil
import statistics
import subprocess
import sys


def read_params(raw):
    """RAWDIR/params.env (the run's parameters, shell assignments) as a dict of strings."""
    p = {}
    with open(os.path.join(raw, "params.env")) as fh:
        for line in fh:
            m = re.match(r'^(\w+)="?(.*?)"?$', line.strip())
            if m:
                p[m.group(1)] = m.group(2)
    return p


def read_jsonl(path):
    """Every JSON document of a JSON-lines file (none when it is missing)."""
    out = []
    if os.path.exists(path):
        with open(path) as fh:
            for line in fh:
                line = line.strip()
                if line:
                    out.append(json.loads(line))
    return out


def spread(values):
    """Median, min, max and count of the values given (None left out); None without any."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def load_json(path):
    """A JSON file, or None when it is missing or unreadable (notes a tool prints before its
    JSON, as fio may, are skipped)."""
    try:
        with open(path) as fh:
            text = fh.read()
        return json.loads(text[text.index("{"):])
    except (OSError, ValueError):
        return None


def gnuplot(script, text, png, who):
    """Writes the gnuplot `text` to `script` and runs it: `png` once drawn, None (with a note
    on stderr from `who`) without gnuplot or when it fails."""
    if not shutil.which("gnuplot"):
        print(f"{who}: gnuplot not found: no chart (scripts/install-deps --for bench)",
              file=sys.stderr)
        return None
    with open(script, "w") as fh:
        fh.write(text)
    r = subprocess.run(["gnuplot", script], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"{who}: gnuplot {script} failed: {r.stderr.strip()}", file=sys.stderr)
        return None
    return png
