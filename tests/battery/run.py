"""Runs the battery: each model family of models.py trained on two devices
with opdump preloaded (the training code does not know opdump), then
`opdump compare` on the two dumps.

    .venv/bin/python tests/battery/run.py                  # every family, cpu vs testdev, no fault
    .venv/bin/python tests/battery/run.py bert llama --fault "aten::gelu=scale:1.01"
    .venv/bin/python tests/battery/run.py llama --autocast bfloat16   # fp32 cpu vs bf16 autocast testdev
    .venv/bin/python tests/battery/run.py llama --compile aot_eager   # torch.compile on both devices

It prints one line per family: the exit status of compare, the first
divergence and the first introduced divergence. tests/test_battery.py uses
`dump()` and `compare()`."""

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "release"


def worker(family, device, steps, models_module, autocast=None, compile=None):
    sys.path.insert(0, str(ROOT))
    import importlib

    import torch  # noqa: F401

    if device.startswith("testdev"):
        import tests.testdev as testdev

        testdev.load()
    models = importlib.import_module(models_module)

    options = {k: v for k, v in (("autocast", autocast), ("compile", compile)) if v}
    losses = models.train(family, device, steps=steps, **options)
    counts = testdev.fault_counts() if device.startswith("testdev") else {}
    print(json.dumps({"losses": losses, "fault_counts": counts}))


def dump(family, device, out, steps=2, fault=None, models="tests.battery.models", autocast=None, compile=None,
         opdump=True, env_extra=None):
    """Trains `family` on `device` in a subprocess with opdump preloaded;
    returns (dump directory, {"losses", "fault_counts"}). autocast: a dtype
    name ("bfloat16") to train in mixed precision with torch.autocast;
    compile: a torch.compile backend; opdump=False: the same job without it;
    env_extra: more variables for the job (`OPDUMP_SKETCH`, for one)."""
    tags = "".join("-" + t for t in (autocast, compile, None if opdump else "off") if t)
    d = Path(out) / f"{family}-{device.replace(':', '_')}{tags}"
    shutil.rmtree(d, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPDUMP") and k != "TESTDEV_FAULT"}
    env.update(PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    if opdump:
        env.update(OPDUMP="1", OPDUMP_DIR=str(d), LD_PRELOAD=str(TARGET / "libopdump.so"))
    if fault:
        env["TESTDEV_FAULT"] = fault
    env.update(env_extra or {})
    p = subprocess.run([sys.executable, __file__, "--worker", family, device, "--steps", str(steps),
                        "--models", models, *(["--autocast", autocast] if autocast else []),
                        *(["--compile", compile] if compile else [])],
                       env=env, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"battery: {family} on {device} failed:\n{p.stderr[-4000:]}")
    return d, json.loads(p.stdout.strip().splitlines()[-1])


def compare(a, b, *extra):
    """`opdump compare A B --json`: (exit status, report)."""
    p = subprocess.run([str(TARGET / "opdump"), "compare", str(a), str(b), "--json", *extra],
                       capture_output=True, text=True, timeout=600)
    if p.returncode not in (0, 1, 3):
        raise RuntimeError(f"opdump compare failed ({p.returncode}): {p.stderr}")
    return p.returncode, json.loads(p.stdout)


def describe(op):
    if op is None:
        return "-"
    return (f"{op['op']} seq {op['seq_a']} {op['phase_a']} step {op['step_a']} "
            f"err {op['rel_err'] or float('inf'):.3g} tol {op['tolerance']:.3g} amp {op['amplification'] or 0:.3g}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("families", nargs="*")
    ap.add_argument("--devices", default="cpu,testdev")
    ap.add_argument("--fault", help="TESTDEV_FAULT for the second device")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--out", default="/tmp/opdump-battery")
    ap.add_argument("--models", default="tests.battery.models",
                    help="module with FAMILIES and train(family, device, steps)")
    ap.add_argument("--autocast", metavar="DTYPE",
                    help="train the second device in mixed precision (torch.autocast, e.g. bfloat16)")
    ap.add_argument("--compile", metavar="BACKEND",
                    help="torch.compile the model on both devices (aot_eager; inductor on the CPU only)")
    ap.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(*args.worker, args.steps, args.models, args.autocast, args.compile)
    sys.path.insert(0, str(ROOT))
    import importlib

    families = importlib.import_module(args.models).FAMILIES

    a_dev, b_dev = args.devices.split(",")
    for fam in args.families or families:
        a, _ = dump(fam, a_dev, args.out, args.steps, models=args.models, compile=args.compile)
        b, res = dump(fam, b_dev, args.out, args.steps, args.fault, models=args.models, autocast=args.autocast,
                      compile=args.compile)
        code, rep = compare(a, b)
        fired = f" fired {res['fault_counts']}" if args.fault else ""
        print(f"{fam:9} exit {code}{fired}\n  first divergence: {describe(rep['first_divergence'])}"
              f"\n  first introduced: {describe(rep['first_introduced'])}", flush=True)


if __name__ == "__main__":
    main()
