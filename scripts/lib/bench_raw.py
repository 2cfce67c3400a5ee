"""What the benchmark reports share (scripts/lib/bench-report.py, bench-qos-report.py): the
raw directory's `params.env` and JSON-lines samples, and the median/min/max of a figure over
the reps. Standard library only."""

import json
import os
import re
import statistics


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
