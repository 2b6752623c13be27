"""The two-device demo: train TinyLM for a couple of steps on two devices,
dump both runs with opdump (through LD_PRELOAD: the training code is not
changed), and let `opdump compare` say where they diverge.

    scripts/demo.sh                                   # cpu vs testdev, gelu wrong by 1%
    scripts/demo.sh --fault none                      # no fault: the devices agree
    scripts/demo.sh --devices cpu,cuda                # on a machine with a GPU
    scripts/demo.sh --fault "aten::addmm=noise:1e-3"  # any TESTDEV_FAULT spec
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "release"


def worker(device, steps):
    """One run, in its own process, with opdump preloaded by the parent."""
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "scripts"))
    import torch

    if device.startswith("testdev"):
        import tests.testdev as testdev

        testdev.load()
    import tinylm

    losses = tinylm.train(device, steps=steps)
    counts = {}
    if device.startswith("testdev"):
        counts = testdev.fault_counts()
    print(json.dumps({"losses": losses, "fault_counts": counts}))


def run_device(device, out, steps, fault):
    dump = out / device.replace(":", "_")
    shutil.rmtree(dump, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPDUMP")}
    env.update(OPDUMP="1", OPDUMP_DIR=str(dump), LD_PRELOAD=str(TARGET / "libopdump.so"), PYTHONUNBUFFERED="1")
    env.pop("TESTDEV_FAULT", None)
    if fault and device.startswith("testdev"):
        env["TESTDEV_FAULT"] = fault
    p = subprocess.run([sys.executable, __file__, "--worker", device, "--steps", str(steps)],
                       env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"demo: the run on {device} failed:\n{p.stderr}")
    for line in p.stderr.splitlines():
        if line.startswith("opdump:"):
            print(f"  [{device}] {line}")
    return dump, json.loads(p.stdout.strip().splitlines()[-1])


def summary(dump):
    import duckdb

    q = f"""
        SELECT phase, step, count(DISTINCT seq) AS op_calls, count(*) AS tensors,
               count(*) FILTER (WHERE nan_count > 0 OR posinf_count > 0 OR neginf_count > 0) AS with_nan_inf
        FROM read_parquet('{dump}/**/*.parquet', hive_partitioning = true)
        GROUP BY ALL ORDER BY step, phase"""
    return duckdb.sql(q)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", default="cpu,testdev", help="two torch device names, reference first")
    ap.add_argument("--fault", default="aten::gelu=scale:1.01",
                    help="TESTDEV_FAULT for the testdev run ('none' for a fault-free run)")
    ap.add_argument("--out", default="opdump-demo", help="where the two dumps and the report go")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker, args.steps)

    devices = [d.strip() for d in args.devices.split(",")]
    if len(devices) != 2:
        sys.exit("demo: --devices takes two device names, e.g. cpu,testdev")
    fault = None if args.fault in ("", "none") else args.fault
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)

    print(f"TinyLM (d=128, 2 blocks, AdamW), {args.steps} steps on {devices[0]} and {devices[1]}")
    if fault and any(d.startswith("testdev") for d in devices):
        print(f"planted fault on testdev: {fault}")
    runs = {}
    for d in devices:
        dump, res = run_device(d, out, args.steps, fault)
        runs[d] = (dump, res)
        fired = "".join(f", fault {k} fired {v}x" for k, v in res["fault_counts"].items())
        print(f"  {d:>10}: losses {['%.6f' % l for l in res['losses']]}{fired}  -> {dump}")
        if fault and d.startswith("testdev") and not any(res["fault_counts"].values()):
            print(f"  note: the fault {fault!r} never fired on {d}: no op of that name reached the device")

    print(f"\nDump of {devices[0]} (DuckDB over the Parquet files):")
    print(summary(runs[devices[0]][0]))

    a, b = runs[devices[0]][0], runs[devices[1]][0]
    cmd = [str(TARGET / "opdump"), "compare", str(a), str(b), "--html", str(out / "report.html"),
           "--out", str(out)]
    print("$ opdump compare", a.name, b.name, flush=True)
    p = subprocess.run(cmd)
    print(f"\nReport: {out / 'report.html'}; per-tensor table: {out / 'compare.parquet'}")
    sys.exit(0 if p.returncode in (0, 1, 3) else p.returncode)


if __name__ == "__main__":
    main()
