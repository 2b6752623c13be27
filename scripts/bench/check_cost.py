"""What the accuracy check (OPDUMP_CHECK=1) costs the job, beside dumping
alone: the time of the first training step, which checks every signature,
and of the steps after it, which check nothing new but one signature again
per step (OPDUMP_CHECK_RECHECK=1, beside the same run with it 0); and how
many distinct signatures a step has.

    .venv/bin/python scripts/bench/check_cost.py                  # TinyLM and the battery's BERT, on the CPU
    .venv/bin/python scripts/bench/check_cost.py --workloads tinylm,bert,resnet --repeats 5 --steps 4

Each (workload, configuration) runs --repeats times in a fresh process, with
the configurations interleaved; the table gives medians and the ratios to
dumping alone (`on`) and to the job without opdump (`baseline`), measured
side by side in this one run. The checking thread's work after the last
step (its queue draining at exit) is not in the step times: the table also
gives the check's own seconds (its summary line) and the signatures.
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
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "release"

CONFIGS = {
    "baseline": {},
    "on": {"OPDUMP": "1"},
    "check": {"OPDUMP": "1", "OPDUMP_CHECK": "1"},
    # The check without the re-check of one signature per later step.
    "check-norecheck": {"OPDUMP": "1", "OPDUMP_CHECK": "1", "OPDUMP_CHECK_RECHECK": "0"},
}


def child(workload, steps):
    """Trains `workload` for `steps` steps on the CPU; prints the step times."""
    sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]
    import torch
    import torch.nn.functional as F

    if workload == "tinylm":
        import tinylm

        model = tinylm.make()
        data = tinylm.batches(steps)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def step(x, y):
            opt.zero_grad()
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            loss.backward()
            opt.step()
            return float(loss)
    else:
        from tests.battery.models import FAMILIES, hf_init

        make, make_data, loss_fn = FAMILIES[workload]
        torch.manual_seed(0)
        model = make()
        if workload in ("bert", "t5", "llama"):
            hf_init(model)
        g = torch.Generator().manual_seed(1)
        data = [make_data(g) for _ in range(steps)]
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def step(inputs, labels):
            loss = loss_fn(model, inputs, labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            return float(loss)

    times = []
    for batch in data:
        t0 = time.perf_counter()
        step(*batch)
        times.append(time.perf_counter() - t0)
    print("BENCH " + json.dumps({"steps": times}), flush=True)


def run(workload, config, steps, tmp):
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPDUMP") and k != "LD_PRELOAD"}
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"))
    d = Path(tempfile.mkdtemp(dir=tmp))
    if config != "baseline":
        env.update(LD_PRELOAD=str(TARGET / "libopdump.so"), OPDUMP_DIR=str(d / "dump"), **CONFIGS[config])
    p = subprocess.run([sys.executable, __file__, "--child", workload, "--steps", str(steps)],
                       env=env, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        sys.exit(f"check_cost: {workload} under {config} failed:\n{p.stderr[-3000:]}")
    times = json.loads([l for l in p.stdout.splitlines() if l.startswith("BENCH ")][-1][6:])["steps"]
    summary = {}
    for f in (d / "dump").glob("checks/rank=*/part-*.jsonl"):
        for line in f.read_text().splitlines():
            row = json.loads(line)
            if row["kind"] == "summary":
                summary = row
    return times, summary


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", default="tinylm,bert")
    ap.add_argument("--steps", type=int, default=4, help="training steps per run (the first checks every signature)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args.child, args.steps)

    print(f"# scripts/bench/check_cost.py --workloads {args.workloads} --steps {args.steps} --repeats {args.repeats}")
    print(f"# CPU, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '1')}; medians of {args.repeats} runs")
    print("| workload | config | first step (s) | later steps (s) | first vs on | later vs on | first vs baseline "
          "| later vs baseline | last half (s) | last half vs on | signatures | check seconds |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for w in args.workloads.split(","):
            got = {c: [] for c in CONFIGS}
            for _ in range(args.repeats):
                for c in CONFIGS:
                    got[c].append(run(w, c, args.steps, tmp))
            med = {}
            for c, runs in got.items():
                first = statistics.median(t[0] for t, _ in runs)
                later = statistics.median(statistics.median(t[1:]) for t, _ in runs)
                # The last half: the first step's checks drained, what a
                # long run pays per step (the re-check's cost).
                steady = statistics.median(statistics.median(t[len(t) // 2:]) for t, _ in runs)
                med[c] = (first, later, steady)
            for c, runs in got.items():
                first, later, steady = med[c]
                checked = c.startswith("check")
                sig = statistics.median(s.get("signatures", 0) for _, s in runs) if checked else ""
                secs = f"{statistics.median(s.get('seconds', 0.0) for _, s in runs):.2f}" if checked else ""
                print(f"| {w} | {c} | {first:.3f} | {later:.4f} | {first / med['on'][0]:.2f}x | "
                      f"{later / med['on'][1]:.2f}x | {first / med['baseline'][0]:.2f}x | "
                      f"{later / med['baseline'][1]:.2f}x | {steady:.4f} | {steady / med['on'][2]:.2f}x | "
                      f"{sig} | {secs} |")


if __name__ == "__main__":
    main()
