"""Two builds of `opdump`, the same command, side by side in one run.

    python scripts/bench/compare_builds.py OLD_BINARY NEW_BINARY DUMP_A DUMP_B [--repeats 5] [-- ARGS...]

Runs `BINARY compare DUMP_A DUMP_B --json ARGS` with each build in turn,
alternating so that both see the same machine, and prints the median wall
time and peak resident memory of each and their ratios (new / old). The
outputs of the two builds must be the same bytes; a difference is reported
and exits 1. Dumps for the 1M-call figure: `cargo run --release -p
opdump-testkit --example synth -- /tmp/bench/a /tmp/bench/b`.
"""

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time


def run_once(binary, args):
    """Wall seconds, peak RSS in MB of the child, and its stdout."""
    t0 = time.perf_counter()
    p = subprocess.run([binary, *args], capture_output=True)
    wall = time.perf_counter() - t0
    # The largest of any child so far: run in a fresh process (see
    # measure_in_child), that is this run's.
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return wall, peak / 1024, p.returncode, p.stdout


def measure_in_child(binary, args):
    """run_once in a fresh Python process, so the RSS peak is this run's."""
    code = (
        f"import sys, json; sys.path.insert(0, {sys.path[0]!r}); import compare_builds as c; "
        f"w, m, rc, out = c.run_once({binary!r}, {args!r}); "
        "sys.stdout.buffer.write(json.dumps([w, m, rc]).encode() + b'\\n' + out)"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True)
    head, _, out = p.stdout.partition(b"\n")
    wall, mb, rc = json.loads(head)
    return wall, mb, rc, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("dump_a")
    ap.add_argument("dump_b")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("extra", nargs="*")
    a = ap.parse_args()
    args = ["compare", a.dump_a, a.dump_b, "--json", *a.extra]
    res = {"old": [], "new": []}
    outs = {}
    for _ in range(a.repeats):
        for name in ("old", "new"):
            wall, mb, rc, out = measure_in_child(getattr(a, name), args)
            res[name].append((wall, mb))
            outs.setdefault(name, (rc, out))
    med = {k: (statistics.median(w for w, _ in v), statistics.median(m for _, m in v)) for k, v in res.items()}
    for k in ("old", "new"):
        print(f"{k}: median {med[k][0]:.2f} s, peak RSS {med[k][1]:.0f} MB over {a.repeats} runs "
              f"(walls {', '.join(f'{w:.2f}' for w, _ in res[k])})")
    print(f"new / old: time {med['new'][0] / med['old'][0]:.3f}, memory {med['new'][1] / med['old'][1]:.3f}")
    if outs["old"] != outs["new"]:
        print("outputs differ (exit status or JSON)")
        return 1
    print("outputs: the same exit status and JSON bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
