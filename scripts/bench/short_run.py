"""A short run with OPDUMP_REFERENCE, whole: what online compare costs a
job of two steps, from its first step to its exit, against dumping alone.

    .venv/bin/python scripts/bench/short_run.py [--steps 2] [--repeats 5] [--device testdev --fault OP=scale:F]
                                                [--old-lib OTHER/libopdump.so]

A short run is where online compare waits: at the end of its first step the
job waits for that step's verdict, so that a call it names is captured in
the next step, and at exit the last steps are judged and the named call is
checked on the CPU. A long run's step time is run.py's `on-reference`.

Each configuration runs in its own subprocess (TinyLM, one intra-op thread,
the data made before the first step) with opdump preloaded and on:

- `on`: dumping alone;
- `on-reference`: with OPDUMP_REFERENCE set to a CPU dump of the same job
  (made once, before the repeats);
- `on-reference-old` (with `--old-lib`): the same with another build of
  libopdump.so, to compare a change side by side.

The child times each step (`opt.step()` and the loss's `item()`, where the
wait at the step's end falls) and then the exit's work, by calling
`torch.ops.opdump.finish()`, which does what the exit handler does: judge
the steps left, wait for the CPU check, complete the files. Each repeat runs
every configuration once, the order rotated each repeat. Printed: per
configuration, the medians over repeats of the first step, the later steps,
the exit, and the whole (steps and exit), with its ratio to `on`, and the
`opdump:` lines of the last repeat.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIB = ROOT / "target" / "release" / "libopdump.so"


def child(device, steps):
    sys.path.insert(0, str(ROOT / "scripts"))
    sys.path.insert(0, str(ROOT))
    import torch
    import torch.nn.functional as F

    import tinylm

    torch.set_num_threads(1)
    if device == "testdev":
        from tests import testdev
        testdev.load()
    model = tinylm.make(0).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = [(x.to(device), y.to(device)) for x, y in tinylm.batches(steps)]
    times = []
    for x, y in data:
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = F.cross_entropy(model(x).float().flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        loss.item()
        times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    torch.ops.opdump.finish()
    print("SHORT " + json.dumps({"steps": times, "exit": time.perf_counter() - t0}), flush=True)


def run(lib, device, steps, dump, fault=None, **env):
    e = {k: v for k, v in os.environ.items() if not k.startswith("OPDUMP") and k != "LD_PRELOAD"}
    e |= {"OPDUMP": "1", "OPDUMP_DIR": str(dump), "LD_PRELOAD": str(lib), "OMP_NUM_THREADS": "1",
          "PYTHONPATH": str(ROOT), **{k: str(v) for k, v in env.items()}}
    if fault:
        e["TESTDEV_FAULT"] = fault
    p = subprocess.run([sys.executable, __file__, "--child", device, "--steps", str(steps)], env=e,
                       capture_output=True, text=True, timeout=600)
    out = [l for l in p.stdout.splitlines() if l.startswith("SHORT ")]
    if p.returncode != 0 or not out:
        sys.exit(f"short_run: the {device} child failed:\n{p.stderr[-3000:]}")
    lines = [l for l in p.stderr.splitlines() if l.startswith("opdump:")]
    return json.loads(out[-1][len("SHORT "):]), lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--fault", help="TESTDEV_FAULT for the run judged (testdev)")
    ap.add_argument("--lib", default=str(LIB))
    ap.add_argument("--old-lib", help="another build of libopdump.so, as on-reference-old")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return child(a.child, a.steps)
    tmp = Path(tempfile.mkdtemp(prefix="opdump-short-run-"))
    ref = tmp / "reference"
    run(a.lib, "cpu", a.steps, ref)
    configs = {"on": (a.lib, {})}
    configs["on-reference"] = (a.lib, {"OPDUMP_REFERENCE": ref})
    if a.old_lib:
        configs["on-reference-old"] = (a.old_lib, {"OPDUMP_REFERENCE": ref})
    names = list(configs)
    res = {n: [] for n in names}
    said = {}
    for r in range(a.repeats):
        for n in names[r % len(names):] + names[:r % len(names)]:
            lib, env = configs[n]
            out, lines = run(lib, a.device, a.steps, tmp / f"{n}-{r}", a.fault, **env)
            res[n].append(out)
            said[n] = lines
        print(f"short_run: repeat {r + 1} of {a.repeats} done", file=sys.stderr, flush=True)

    def med(n, f):
        return statistics.median(f(o) for o in res[n])

    def whole(o):
        return sum(o["steps"]) + o["exit"]

    base = med("on", whole)
    print(f"TinyLM, {a.steps} steps on {a.device}{' with ' + a.fault if a.fault else ''}, one intra-op thread, "
          f"medians of {a.repeats} repeats (ms)\n")
    print("| config | first step | later steps, each | exit | whole | ratio |")
    print("|---|---|---|---|---|---|")
    for n in names:
        later = med(n, lambda o: statistics.median(o["steps"][1:]) if len(o["steps"]) > 1 else 0.0)
        print(f"| {n} | {med(n, lambda o: o['steps'][0]) * 1e3:.1f} | {later * 1e3:.1f} | "
              f"{med(n, lambda o: o['exit']) * 1e3:.1f} | {med(n, whole) * 1e3:.1f} | {med(n, whole) / base:.2f}x |")
    for n in names:
        print(f"\n{n}: " + ("\n  ".join(said[n]) if said[n] else "(no opdump: line)"))


if __name__ == "__main__":
    main()
