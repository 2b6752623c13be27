"""The two-device demo: train TinyLM for a few steps on two devices, dump
both runs with opdump (through LD_PRELOAD: the training code is not
changed). The run on the second device is judged against the first's dump
while it runs (OPDUMP_REFERENCE): it names the op that introduced the
divergence, captures that call in a later step and runs it again on the
CPU to say which device is off. `opdump compare` then gives the same
answer offline, with the full report.

    scripts/demo.sh                                   # cpu vs testdev, gelu wrong by 1%
    scripts/demo.sh --fault none                      # no fault: the devices agree
    scripts/demo.sh --devices cpu,cuda                # on a machine with a GPU
    scripts/demo.sh --fault "aten::addmm=noise:1e-3"  # any TESTDEV_FAULT spec
    scripts/demo.sh --offline                         # two plain dumps, compared afterwards only
    scripts/demo.sh --repro                           # then the manual loop: both runs again capturing
                                                      # the call compare named, and opdump repro
    scripts/demo.sh --check                           # one device, no reference: the accuracy check
                                                      # (OPDUMP_CHECK=1) names the faulted op
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


def worker(device, steps, checksum=False):
    """One run, in its own process, with opdump preloaded by the parent.
    checksum: end with a float64 sum of the weights, on the CPU, as jobs
    often do (a float64 op on float32 values that carry the run's drift)."""
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "scripts"))

    if device.startswith("testdev"):
        import tests.testdev as testdev

        testdev.load()
    import tinylm

    sums = []

    def weights_checksum(model):
        sums.append(float(sum(p.double().cpu().sum() for p in model.parameters())))

    losses = tinylm.train(device, steps=steps, after=weights_checksum if checksum else None)
    counts = {}
    if device.startswith("testdev"):
        counts = testdev.fault_counts()
    print(json.dumps({"losses": losses, "fault_counts": counts, "checksum": sums}))


def run_device(device, out, steps, fault, capture=None, env_extra=None):
    dump = out / (device.replace(":", "_") + ("-capture" if capture else ""))
    shutil.rmtree(dump, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPDUMP")}
    env.update(OPDUMP="1", OPDUMP_DIR=str(dump), LD_PRELOAD=str(TARGET / "libopdump.so"), PYTHONUNBUFFERED="1")
    if capture:
        env["OPDUMP_CAPTURE"] = capture
    env.update(env_extra or {})
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
    # Online compare judges a step once two more have begun, and captures
    # the named call in the step after the one the job is in by then: six
    # short steps leave room for that.
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--offline", action="store_true",
                    help="dump both runs plainly; no judging against the reference while the second runs")
    ap.add_argument("--repro", action="store_true",
                    help="then capture the first introduced call in both runs and reproduce it (opdump repro)")
    ap.add_argument("--check", action="store_true",
                    help="one run on the second device only, with the accuracy check (OPDUMP_CHECK=1) and no "
                         "reference: each distinct op call is run again on the CPU, and opdump check names the "
                         "faulted op")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--checksum", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker, args.steps, args.checksum)

    devices = [d.strip() for d in args.devices.split(",")]
    if len(devices) != 2:
        sys.exit("demo: --devices takes two device names, e.g. cpu,testdev")
    fault = None if args.fault in ("", "none") else args.fault
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)

    if args.check:
        sys.exit(check_one_device(devices[1], out, fault))
    print(f"TinyLM (d=128, 2 blocks, AdamW), {args.steps} steps on {devices[0]} and {devices[1]}")
    if fault and any(d.startswith("testdev") for d in devices):
        print(f"planted fault on testdev: {fault}")
    runs = {}
    for n, d in enumerate(devices):
        online = {}
        if n == 1 and not args.offline:
            reference = runs[devices[0]][0]
            online = {"OPDUMP_REFERENCE": str(reference)}
            print(f"  {d:>10}: judged against the {devices[0]} dump while it runs (OPDUMP_REFERENCE={reference.name})")
        dump, res = run_device(d, out, args.steps, fault, env_extra=online)
        runs[d] = (dump, res)
        fired = "".join(f", fault {k} fired {v}x" for k, v in res["fault_counts"].items())
        print(f"  {d:>10}: losses {[f'{v:.6f}' for v in res['losses']]}{fired}  -> {dump}")
        if fault and d.startswith("testdev") and not any(res["fault_counts"].values()):
            print(f"  note: the fault {fault!r} never fired on {d}: no op of that name reached the device")

    if not args.offline:
        print_online_verdict(runs[devices[1]][0])
    print(f"\nDump of {devices[0]} (DuckDB over the Parquet files):")
    print(summary(runs[devices[0]][0]))

    a, b = runs[devices[0]][0], runs[devices[1]][0]
    cmd = [str(TARGET / "opdump"), "compare", str(a), str(b), "--html", str(out / "report.html"),
           "--out", str(out)]
    print("$ opdump compare", a.name, b.name, flush=True)
    p = subprocess.run(cmd)
    print(f"\nReport: {out / 'report.html'}; per-tensor table: {out / 'compare.parquet'}")
    if args.repro:
        if p.returncode != 1:
            sys.exit("demo: --repro needs a divergence that an op introduced; this comparison found none")
        sys.exit(capture_and_reproduce(devices, out, args.steps, fault))
    if not args.offline and list(b.glob("rank=*/device=*/capture-*.safetensors")):
        # The run under test captured the named call itself: no run again.
        print("\n== repro, from the call the run under test captured")
        code = reproduce(a, b, out, devices, fault)
        if code != 0:
            sys.exit(code)
    sys.exit(0 if p.returncode in (0, 1, 3) else p.returncode)


def check_one_device(device, out, fault):
    """The accuracy check: one run, no reference dump; then `opdump check`."""
    print(f"TinyLM (d=128, 2 blocks, AdamW), 2 steps on {device} alone, with OPDUMP_CHECK=1")
    if fault and device.startswith("testdev"):
        print(f"planted fault on testdev: {fault}")
    print("  each distinct op call runs again on the CPU, in float64 and in its own dtype, on opdump's own thread")
    (out / "check").mkdir(exist_ok=True)
    dump, res = run_device(device, out / "check", 2, fault, env_extra={"OPDUMP_CHECK": "1"})
    print(f"  {device:>10}: losses {[f'{v:.6f}' for v in res['losses']]}  -> {dump}")
    print(f"\n$ opdump check {dump.name}", flush=True)
    p = subprocess.run([str(TARGET / "opdump"), "check", str(dump)])
    return 0 if p.returncode in (0, 1) else p.returncode


def print_online_verdict(dump):
    """The run's own verdict, from the file online compare wrote into it."""
    files = sorted(dump.glob("verdicts/rank=*/part-*.jsonl"))
    if not files:
        return
    rows = [json.loads(l) for l in files[0].read_text().splitlines()]
    final = next((r for r in reversed(rows) if r["kind"] == "final"), None)
    if final is None:
        return
    print(f"\nVerdict stored in {files[0].relative_to(dump.parent)}: {final['outcome']}"
          f" (the exit status opdump compare gives: {final['exit_status']})")
    captures = sorted(dump.glob("rank=*/device=*/capture-*.safetensors"))
    for c in captures:
        print(f"  captured in the same run: {c.relative_to(dump.parent)}")


def capture_and_reproduce(devices, out, steps, fault):
    """Steps 3 and 4: the two runs again, capturing the call compare named,
    then opdump repro on the new dumps and the script it writes."""
    with open(out / "compare.json") as f:
        nxt = json.load(f)["next"]
    print("\n== capture: both runs again, with the OPDUMP_CAPTURE values compare printed")
    dumps = []
    for d, sel in zip(devices, (nxt["capture_a"], nxt["capture_b"])):
        dump, _ = run_device(d, out, steps, fault, capture=sel)
        files = sorted(dump.glob("rank=*/device=*/capture-*.safetensors"))
        size = sum(f.stat().st_size for f in files)
        print(f"  {d:>10}: OPDUMP_CAPTURE='{sel}' -> {len(files)} file, {size / 1024:.0f} KiB: "
              + ", ".join(str(f.relative_to(out)) for f in files))
        dumps.append(dump)
    print("\n== repro")
    return reproduce(dumps[0], dumps[1], out, devices, fault)


def reproduce(dump_a, dump_b, out, devices, fault):
    """opdump repro on the two dumps, then the script it writes."""
    repro_dir = out / "repro"
    shutil.rmtree(repro_dir, ignore_errors=True)
    cmd = [str(TARGET / "opdump"), "repro", str(dump_a), str(dump_b), "--out", str(repro_dir)]
    print(f"$ opdump repro {dump_a.name} {dump_b.name} --out {repro_dir.name}", flush=True)
    p = subprocess.run(cmd)
    if p.returncode != 0:
        return p.returncode
    setup = ["--setup", "tests.testdev:load"] if any(d.startswith("testdev") for d in devices) else []
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env = {k: v for k, v in env.items() if not k.startswith("OPDUMP") and k != "LD_PRELOAD"}
    if fault:
        env["TESTDEV_FAULT"] = fault  # the device under test keeps its fault
    print(f"$ python {repro_dir.name}/repro.py {' '.join(setup)}", flush=True)
    p = subprocess.run([sys.executable, str(repro_dir / "repro.py"), *setup], env=env)
    return 0 if p.returncode in (0, 1) else p.returncode


if __name__ == "__main__":
    main()
