"""What one measurement costs, by tensor size, on the CPU and on testdev:
the time of `aten::alias(x)` with dumping on and OPDUMP_REUSE=0 (one input
measured, its output a view), per call, with the flush that brings the last
device results back counted in. Each setting runs in its own process.

    .venv/bin/python scripts/bench/device_measure.py
    .venv/bin/python scripts/bench/device_measure.py --lib /path/to/an/earlier/libopdump.so
    .venv/bin/python scripts/bench/device_measure.py --env TESTDEV_FUSED_STATS=0

Prints a markdown table: microseconds per call and nanoseconds per element.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))
from run import LIB, VENV_PY, clean_env  # noqa: E402

SIZES = [64, 4096, 65536, 262144, 1 << 20, 4 << 20]


def child(spec: dict) -> None:
    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, str(ROOT))
    import tests.testdev as testdev

    testdev.load(build=False)
    torch.ops.load_library(spec["lib"])
    out = {}
    for n in spec["sizes"]:
        x = torch.randn(n).to(spec["device"])
        calls = max(20, min(2000, int(2e8 // (n * 40))))
        torch.ops.opdump.enable()
        for _ in range(3):
            torch.ops.aten.alias(x)
        torch.ops.opdump.flush()
        t0 = time.perf_counter()
        for _ in range(calls):
            torch.ops.aten.alias(x)
        torch.ops.opdump.flush()
        out[n] = (time.perf_counter() - t0) / calls
        torch.ops.opdump.disable()
    print("MEASURE " + json.dumps(out), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--lib", default=str(LIB))
    ap.add_argument("--devices", default="cpu,testdev")
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                    help="an environment variable of the measuring process; repeatable")
    args = ap.parse_args()
    if args.child:
        child(json.loads(args.child))
        return 0
    rows = {}
    with tempfile.TemporaryDirectory(prefix="opdump-measure-") as tmp:
        for dev in args.devices.split(","):
            env = clean_env()
            env.update(e.split("=", 1) for e in args.env)
            env.update(OPDUMP_DIR=str(Path(tmp) / dev), OPDUMP_REUSE="0")
            spec = dict(device=dev, lib=args.lib, sizes=SIZES)
            r = subprocess.run([str(VENV_PY), __file__, "--child", json.dumps(spec)], env=env, capture_output=True,
                               text=True)
            lines = [l for l in r.stdout.splitlines() if l.startswith("MEASURE ")]
            if r.returncode != 0 or not lines:
                print(f"device_measure: {dev} failed: {r.stderr[-1500:]}", file=sys.stderr)
                return 1
            rows[dev] = {int(k): v for k, v in json.loads(lines[-1][8:]).items()}
    print(f"`scripts/bench/device_measure.py{''.join(' --env ' + e for e in args.env)}`; library {args.lib}")
    print()
    print("| elements | " + " | ".join(f"{d} µs/call | {d} ns/element" for d in rows) + " |")
    print("|---:|" + "---:|---:|" * len(rows))
    for n in SIZES:
        print(f"| {n:,} | " + " | ".join(f"{rows[d][n] * 1e6:.1f} | {rows[d][n] * 1e9 / n:.2f}" for d in rows) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
