"""opdump's host cost per op call on a host-bound job: greedy `generate` of
a small Hugging Face GPT-2 (random weights) on the CPU, with one intra-op
thread, where almost all of the time is the dispatcher's and the hook's.

    .venv/bin/python scripts/bench/host_cost.py                 # 5 repeats
    .venv/bin/python scripts/bench/host_cost.py --repeats 9 --tokens 48

Needs `transformers` (not a test dependency): `.venv/bin/python -m pip
install transformers`, or `pip install --target DIR transformers` and
`PYTHONPATH=DIR`.

Each configuration runs in its own process, interleaved (each repeat runs
every configuration once, the order rotated by one per repeat). A process
builds the model, generates once to warm up, then times `--runs` generations
and reports their median. The table gives the median over repeats of those
medians, the ratio to the baseline, and the microseconds per op call over
the baseline and over the empty hook: (time − time of the base) / op calls,
the op calls counted from the dump of `on`.

Configurations:
- `baseline`: opdump not loaded;
- `off`: loaded (`torch.ops.load_library`), `OPDUMP` unset;
- `hook-only`: `OPDUMP=1 OPDUMP_HOOK_ONLY=1`, the fallback only redispatches;
- `none-selected`: `OPDUMP=1` with an `OPDUMP_INCLUDE` that matches no op;
- `on`: `OPDUMP=1`, every other variable at its default.

`--before DIR` (a folder holding another build's `libopdump.so` and
`libopdump_core.so`) adds `NAME-before` for each configuration named in
`--before-configs` (default `none-selected,on`): that build, interleaved with
this one in the same repeats."""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIB = ROOT / "target" / "release" / "libopdump.so"
CONFIGS = {
    "baseline": None,
    "off": {},
    "hook-only": {"OPDUMP": "1", "OPDUMP_HOOK_ONLY": "1"},
    "none-selected": {"OPDUMP": "1", "OPDUMP_INCLUDE": "^matches-no-op$"},
    "on": {"OPDUMP": "1"},
}


def child(tokens, runs, load):
    """One process: times `runs` greedy generations; prints JSON."""
    import time

    import torch

    torch.set_num_threads(1)
    if load:
        torch.ops.load_library(load)
    import transformers as T

    torch.manual_seed(0)
    cfg = T.GPT2Config(vocab_size=1000, n_positions=128, n_embd=128, n_layer=2, n_head=4)
    model = T.GPT2LMHeadModel(cfg).eval()
    prompt = torch.randint(0, 1000, (1, 8))
    kw = dict(max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        model.generate(prompt, **kw)
        times, cpu, out = [], [], None
        for _ in range(runs):
            t0, c0 = time.perf_counter(), time.thread_time()
            out = model.generate(prompt, **kw)
            times.append(time.perf_counter() - t0)
            cpu.append(time.thread_time() - c0)
    print(json.dumps({"median_s": statistics.median(times), "cpu_s": statistics.median(cpu),
                      "tokens": out[0].tolist()}))


def run(name, env_extra, args, tmp):
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPDUMP") and k != "LD_PRELOAD"}
    env.update(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    dump = tmp / f"dump-{name}"
    shutil.rmtree(dump, ignore_errors=True)
    load = ""
    if env_extra is not None:
        env.update(env_extra, OPDUMP_DIR=str(dump))
        load = str(tmp / ("before" if name.endswith("-before") else "") / "libopdump.so")
    argv = [sys.executable, __file__, "--child", str(args.tokens), str(args.runs), load]
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        sys.exit(f"host_cost: {name} failed:\n{p.stderr[-3000:]}")
    res = json.loads(p.stdout.strip().splitlines()[-1])
    res["calls"] = op_calls(dump) if name == "on" else None
    shutil.rmtree(dump, ignore_errors=True)
    return res


def op_calls(dump):
    """Op calls recorded in the timed generations and the warm-up: distinct
    (pid, seq) in the dump."""
    import pyarrow.parquet as pq

    seqs = set()
    for f in Path(dump).rglob("*.parquet"):
        t = pq.read_table(f, columns=["pid", "seq"]).to_pydict()
        seqs.update(zip(t["pid"], t["seq"]))
    return len(seqs)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--runs", type=int, default=3, help="timed generations per process")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--clock", choices=("wall", "thread"), default="wall",
                    help="thread: the job's thread's CPU time, which other processes on a loaded machine move less")
    ap.add_argument("--before", type=Path, help="folder of another build's libraries, run beside this one")
    ap.add_argument("--before-configs", default="none-selected,on")
    args = ap.parse_args()
    names = args.configs.split(",")
    tmp = Path(tempfile.mkdtemp(prefix="host-cost-"))
    # One build for the whole run, whatever happens to target/ meanwhile.
    shutil.copy(LIB, tmp / "libopdump.so")
    core = LIB.with_name("libopdump_core.so")
    if core.exists():
        shutil.copy(core, tmp / core.name)
    if args.before:
        (tmp / "before").mkdir()
        for lib in ("libopdump.so", "libopdump_core.so"):
            shutil.copy(args.before / lib, tmp / "before" / lib)
        for n in args.before_configs.split(","):
            CONFIGS[f"{n}-before"] = CONFIGS[n]
            names.append(f"{n}-before")
    results = {n: [] for n in names}
    calls, tokens = None, None
    for r in range(args.repeats):
        order = names[r % len(names):] + names[:r % len(names)]
        for n in order:
            res = run(n, CONFIGS[n], args, tmp)
            results[n].append(res["median_s"] if args.clock == "wall" else res["cpu_s"])
            calls = res["calls"] or calls
            if tokens is None:
                tokens = res["tokens"]
            elif res["tokens"] != tokens:
                sys.exit(f"host_cost: {n} generated other tokens than the first run")
            print(f"repeat {r} {n:20} {res['median_s'] * 1e3:8.1f} ms wall {res['cpu_s'] * 1e3:8.1f} ms thread",
                  file=sys.stderr)
    shutil.rmtree(tmp, ignore_errors=True)
    # The dump holds the warm-up and the timed generations: calls per one.
    per_gen = calls / (args.runs + 1) if calls else None
    med = {n: statistics.median(v) for n, v in results.items()}
    base = med.get("baseline")
    hook = med.get("hook-only")
    print(f"GPT-2 (2 layers, d=128) greedy generate of {args.tokens} tokens, 1 thread, "
          f"medians of {args.repeats} repeats ({args.clock} clock); {per_gen:,.0f} op calls a generation\n"
          if per_gen else "")
    print("| configuration | time | ratio | µs a call over baseline | µs a call over the empty hook | spread |")
    print("|---|---:|---:|---:|---:|---|")
    def over(t, ref):
        return f"{(t - ref) / per_gen * 1e6:.2f}" if ref is not None and per_gen else "–"

    for n in names:
        t = med[n]
        spread = f"{min(results[n]) * 1e3:.0f}–{max(results[n]) * 1e3:.0f} ms"
        print(f"| {n} | {t * 1e3:.1f} ms | {t / base:.2f}× | {over(t, base)} | {over(t, hook)} | {spread} |"
              if base else f"| {n} | {t * 1e3:.1f} ms | – | – | {over(t, hook)} | {spread} |")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] or None)
    else:
        main()
