"""Where the time goes: `perf record` on one benchmark configuration, reported
for the timed steps only (after warm-up and start-up).

    .venv/bin/python scripts/bench/perf_profile.py                      # on, tiny, 1 thread
    .venv/bin/python scripts/bench/perf_profile.py --config off --steps 40
    .venv/bin/python scripts/bench/perf_profile.py --workload large --steps 2
    .venv/bin/python scripts/bench/perf_profile.py --workload testdev \\
        --env TESTDEV_SYNC_US=20 --env TESTDEV_HIDE_FALLBACK=1

Needs `perf` (Debian: `apt-get install linux-perf`) and
kernel.perf_event_paranoid <= 2. The child prints CLOCK_MONOTONIC marks around
the timed steps and perf records with the same clock, so `perf report --time`
keeps the timed window only. Prints the top symbols (by thread name, library
and symbol, self time) and the split by library.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))
from run import LIB, VENV_PY, WORKLOADS, clean_env  # noqa: E402


def child(spec: dict) -> None:
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(ROOT / "scripts"))
    import tinylm

    if spec["threads"] == 1:
        torch.set_num_threads(1)
    cfg = spec["config"]
    w = WORKLOADS[spec["workload"]]
    device = w.get("device", "cpu")
    if device == "testdev":
        sys.path.insert(0, str(ROOT))
        import tests.testdev as testdev

        testdev.load(build=False)
    if cfg in ("off", "on", "on-noreuse"):
        torch.ops.load_library(str(LIB))
    peer = None
    if cfg == "peer":
        from peer_dumper import PeerDumper
        peer = PeerDumper(spec["out_dir"])
        peer.__enter__()
    model = tinylm.make(0, vocab=w["vocab"], d=w["d"], layers=w["layers"], heads=w["heads"], seq=w["seq"])
    model = model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = tinylm.batches(spec["warmup"] + spec["steps"], batch=w["batch"], seq=w["seq"], vocab=w["vocab"])
    data = [(x.to(device), y.to(device)) for x, y in data]
    times = []
    for i, (x, y) in enumerate(data):
        if i == spec["warmup"]:
            if cfg in ("on", "on-noreuse"):
                torch.ops.opdump.flush()
            print(f"MARK_START {time.clock_gettime(time.CLOCK_MONOTONIC):.6f}", flush=True)
        t0 = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(model(x).float().flatten(0, 1), y.flatten()).backward()
        opt.step()
        if i >= spec["warmup"]:
            times.append(time.perf_counter() - t0)
    if cfg in ("on", "on-noreuse"):
        torch.ops.opdump.flush()
    elif peer is not None:
        peer.__exit__(None, None, None)
        peer.close()
    print(f"MARK_END {time.clock_gettime(time.CLOCK_MONOTONIC):.6f}", flush=True)
    print("STEPS " + json.dumps(times), flush=True)


STATS_KERNEL = ("add_block", "accumulate<", "add_finite")


def job_thread_split(data: str, window: str, top: int = 12) -> list[str]:
    """The job thread's samples in four parts, by the leaf of each stack:
    opdump's statistics kernels; the rest of opdump's own code (the record
    path); code opdump calls (libc, torch helpers) below an opdump frame and
    above the op's own redispatch; everything else (torch's work, Python).
    Then the largest leaves of the record path."""
    rep = subprocess.run(["perf", "script", "-i", data, "--time", window, "--comm", "python", "-F", "ip,sym,dso"],
                         capture_output=True, text=True)
    if rep.returncode != 0:
        return []
    parts = {"statistics kernel": 0, "record path (opdump's own code)": 0, "called by opdump": 0,
             "torch, Python and the rest": 0}
    leaves: dict[str, int] = {}
    samples = [s for s in rep.stdout.split("\n\n") if s.strip()]
    for sample in samples:
        frames = [l.strip().split(" ", 1)[-1] for l in sample.splitlines() if l.strip()]
        leaf = frames[0].split(" (")[0].split("+0x")[0]
        # The frames down to the op's own kernel: a redispatch is where
        # opdump hands the call on, and below it is the op's work.
        above = []
        for f in frames:
            if "redispatchBoxed" in f or "callBoxed" in f:
                break
            above.append(f)
        if any(k in leaf for k in STATS_KERNEL):
            parts["statistics kernel"] += 1
        elif "libopdump" in frames[0]:
            parts["record path (opdump's own code)"] += 1
            name = leaf.replace("(anonymous namespace)::", "")[:90]
            leaves[name] = leaves.get(name, 0) + 1
        elif any("libopdump" in f for f in above[1:]):
            parts["called by opdump"] += 1
        else:
            parts["torch, Python and the rest"] += 1
    n = max(len(samples), 1)
    out = [f"{v * 100 / n:6.1f}%  {k}" for k, v in parts.items()]
    out.append("  of the record path, the largest leaves:")
    for name, v in sorted(leaves.items(), key=lambda kv: -kv[1])[:top]:
        out.append(f"{v * 100 / n:8.2f}%  {name}")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--config", default="on", choices=["baseline", "off", "on", "on-noreuse", "peer"])
    ap.add_argument("--workload", default="tiny", choices=sorted(WORKLOADS))
    ap.add_argument("--threads", default="1", choices=["1", "default"])
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--top", type=int, default=25, help="symbols to print")
    ap.add_argument("--freq", type=int, default=999)
    ap.add_argument("--keep", help="keep perf.data at this path")
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                    help="an environment variable of the profiled process (TESTDEV_SYNC_US=20, ...); repeatable")
    args = ap.parse_args()
    if args.child:
        child(json.loads(args.child))
        return 0
    if not shutil.which("perf"):
        print("profile: perf not found (Debian: apt-get install linux-perf)", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="opdump-profile-", dir="/tmp"))
    try:
        spec = dict(config=args.config, workload=args.workload, threads=1 if args.threads == "1" else 0,
                    warmup=args.warmup, steps=args.steps, out_dir=str(tmp / "dump"))
        env = clean_env()
        env.update(e.split("=", 1) for e in args.env)
        if args.config in ("on", "on-noreuse"):
            env.update(OPDUMP="1", OPDUMP_DIR=str(tmp / "dump"))
            if args.config == "on-noreuse":
                env["OPDUMP_REUSE"] = "0"
        data = args.keep or str(tmp / "perf.data")
        r = subprocess.run(["perf", "record", "-k", "CLOCK_MONOTONIC", "-F", str(args.freq), "-g", "-o", data,
                            str(VENV_PY), str(Path(__file__).resolve()), "--child", json.dumps(spec)],
                           capture_output=True, text=True, env=env, cwd=str(tmp))
        marks = dict(l.split()[:2] for l in r.stdout.splitlines() if l.startswith("MARK_"))
        steps = [json.loads(l[6:]) for l in r.stdout.splitlines() if l.startswith("STEPS ")]
        if r.returncode != 0 or "MARK_START" not in marks or "MARK_END" not in marks:
            print(f"profile: the run failed (exit {r.returncode}):\n{r.stderr[-2000:]}", file=sys.stderr)
            return 1
        window = f"{marks['MARK_START']},{marks['MARK_END']}"
        st = steps[0] if steps else []
        print(f"perf record -g, config {args.config}, workload {args.workload}, threads {args.threads}: "
              f"{len(st)} timed steps, median {sorted(st)[len(st) // 2] * 1e3:.1f} ms/step "
              f"(under perf); samples from the timed window only, self time")
        if args.keep:
            print(f"perf.data kept at {data}; the timed window for `perf report --time`: {window}")
        for sort, top in (("comm,dso,symbol", args.top), ("comm,dso", 12)):
            rep = subprocess.run(["perf", "report", "-i", data, "--time", window, "--no-children", "-g", "none",
                                  "--sort", sort, "--stdio", "--percent-limit", "0.3"],
                                 capture_output=True, text=True)
            lines = [l.rstrip() for l in rep.stdout.splitlines() if l.strip() and not l.startswith("#")]
            print()
            print(f"## by {sort}")
            for l in lines[:top]:
                print(l[:200])
        # Inclusive time of opdump's own functions on the job's thread: what
        # the fallback costs in all, and its parts (statistics, metadata, the
        # hand-off to Rust).
        rep = subprocess.run(["perf", "report", "-i", data, "--time", window, "--children", "-g", "none",
                              "--comm", "python", "--dsos", "libopdump_core.so", "--sort", "symbol",
                              "--stdio", "--percent-limit", "0.3"], capture_output=True, text=True)
        lines = [l.rstrip() for l in rep.stdout.splitlines() if l.strip() and not l.startswith("#")]
        print()
        print("## opdump on the job's thread, inclusive (children, self)")
        for l in lines[:args.top]:
            print(l[:200])
        split = job_thread_split(data, window)
        if split:
            print()
            print("## the job's thread, split by the leaf of each sample's stack")
            for line in split:
                print(line)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
