"""Side-by-side benchmark of opdump against no dumper and its peers.

    scripts/bench/run.sh              # the full run (scripts/bench/README.md, "How long")
    scripts/bench/run.sh --quick      # TinyLM, one thread only, no parts (about 4 minutes)

Every configuration runs in its own subprocess (so the library is loaded or
not), which builds the model, runs warm-up steps, then times each training
step itself and reports the times as one JSON line. The parent interleaves
the configurations (their order rotated each repeat), takes at least 5
repeats, and prints, per workload and thread setting, the median step time
of each configuration and its ratio to the baseline, then the physical limit:
what any dumper must at least add to a step (read every tensor opdump measured,
at this machine's read bandwidth, plus an empty hook per op call), next to what
opdump adds.

Configurations:
  baseline    opdump not loaded
  off         libopdump.so loaded (torch.ops.load_library), dumping off
  hook-only   OPDUMP=1 OPDUMP_HOOK_ONLY=1: the fallback on every op, only redispatching
              (left out, with the reason in the report, when the build does not know it)
  on          OPDUMP=1, defaults
  on-noreuse  OPDUMP=1 OPDUMP_REUSE=0 (reuse and view shortcuts off)
  peer        scripts/bench/peer_dumper.py, a Python TorchDispatchMode
  msprobe     mindstudio-probe, task statistics, level L1 (from its own venv)
and, on request (--configs): on-nomodules (OPDUMP_MODULES=0), on-source
(OPDUMP_SOURCE=1), on-sketch (OPDUMP_SKETCH=16), on-before (the --before-lib build),
on-reference (OPDUMP_REFERENCE: judged against a dump of the same child run as
`on`, made once per thread setting before the repeats; its cost is that of
online compare), on-reference-before (on-reference with the --before-lib build).
--extra NAME=BASE,VAR=VALUE,... adds a configuration NAME that runs as BASE with
the variables in its environment, e.g. on-passive=on,OMP_WAIT_POLICY=PASSIVE.

Then the device tables: the TinyLM step on the test device `testdev`, with a
simulated cost per host wait (TESTDEV_SYNC_US, --testdev-sync-us, default 20 µs)
and per kernel launch (TESTDEV_LAUNCH_US, --testdev-launch-us, default 5 µs; every
configuration, the baseline too, pays it), one table per way testdev runs
(TESTDEV_SETTINGS: with kernels of its own and a fused statistics kernel; with
ATen reductions for the statistics, as on CUDA; with its CPU fallback seen),
in the configurations
  baseline, off, on  as above
  on-sync     OPDUMP=1 OPDUMP_DEVICE_SYNC=1 (the job's thread waits for every measured tensor)
  on-sketch   OPDUMP=1 OPDUMP_SKETCH=16 (statistics with fingerprint and sketch)
  on-before   OPDUMP=1 with the library given by --before-lib (an earlier build, for before/after)
Under each device table a second one gives, per dumping configuration, over
the timed steps and the final flush: the device tensors opdump measured a step
(torch.ops.opdump.device_stats()[0]), opdump's launches per measured tensor
(testdev's "observer" launches: those made with opdump's dispatch key
excluded, i.e. its statistics work) and the job's thread's time per measured
tensor ((median step time - baseline's) / measured tensors a step).

Then the parts: the writer alone (scripts/bench/writer-bench) and
`opdump compare` on two synthetic dumps of 1,000,000 op calls each.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
LIB = ROOT / "target" / "release" / "libopdump.so"
OPDUMP_CLI = ROOT / "target" / "release" / "opdump"
VENV_PY = ROOT / ".venv" / "bin" / "python"
MSPROBE_VENV = Path(os.environ.get("BENCH_MSPROBE_VENV", "/tmp/msprobe-venv"))

WORKLOADS = {
    # The demo's TinyLM step.
    "tiny": dict(d=128, layers=2, heads=4, seq=32, batch=16, vocab=512),
    # The same step with a 1,000-word vocabulary: a larger embedding, head and logits.
    "tiny-v1000": dict(d=128, layers=2, heads=4, seq=32, batch=16, vocab=1000),
    # Larger tensors, so the statistics passes show against memory bandwidth.
    "large": dict(d=512, layers=4, heads=8, seq=64, batch=8, vocab=512),
    # The demo's TinyLM step on the test device (the device tables).
    "testdev": dict(d=128, layers=2, heads=4, seq=32, batch=16, vocab=512, device="testdev"),
}
CONFIGS = ["baseline", "off", "hook-only", "on", "on-noreuse", "peer", "msprobe"]
DEVICE_CONFIGS = ["baseline", "off", "on", "on-sync", "on-sketch", "on-before"]
# How testdev runs, for the device tables: (title, environment).
TESTDEV_SETTINGS = {
    "fused": ("testdev with kernels of its own, multi-tensor `_foreach_` kernels and a batch statistics kernel "
              "(TESTDEV_HIDE_FALLBACK=1 TESTDEV_FOREACH=1), as a backend with its own kernels",
              {"TESTDEV_HIDE_FALLBACK": "1", "TESTDEV_FUSED_STATS": "1", "TESTDEV_DIRECT": "1",
               "TESTDEV_FOREACH": "1"}),
    "aten": ("testdev with kernels of its own and multi-tensor `_foreach_` kernels, statistics by ATen ops "
             "(TESTDEV_HIDE_FALLBACK=1 TESTDEV_FOREACH=1 TESTDEV_FUSED_STATS=0), as on CUDA",
             {"TESTDEV_HIDE_FALLBACK": "1", "TESTDEV_FUSED_STATS": "0", "TESTDEV_DIRECT": "1", "TESTDEV_FOREACH": "1"}),
    "fallback": ("testdev with its CPU fallback seen and no direct kernels "
                 "(TESTDEV_DIRECT=0 TESTDEV_FUSED_STATS=0), as the 26-50x were measured",
                 {"TESTDEV_HIDE_FALLBACK": "0", "TESTDEV_FUSED_STATS": "0", "TESTDEV_DIRECT": "0"}),
}
# The configurations that load libopdump.so, and those that dump with it.
LOADING = ("off", "hook-only", "on", "on-noreuse", "on-sync", "on-before", "on-nomodules", "on-source", "on-sketch",
           "on-reference", "on-reference-before")
DUMPING = ("on", "on-noreuse", "on-sync", "on-before", "on-nomodules", "on-source", "on-sketch", "on-reference",
           "on-reference-before")
# The configurations that load the --before-lib build.
BEFORE = ("on-before", "on-reference-before")
# --extra NAME=BASE,VAR=VALUE,...: NAME runs as BASE with VAR=VALUE added to
# its environment (parent only; the child gets BASE and the variables in its spec).
EXTRA_BASES = ("baseline", "off", "on", "on-noreuse", "on-nomodules", "on-source", "on-sketch", "on-before")
EXTRA: dict = {}


def base_of(config: str) -> str:
    return EXTRA[config][0] if config in EXTRA else config


def extra_vars(config: str) -> str:
    """The VAR=VALUE text of an --extra configuration."""
    return " ".join(f"{k}={v}" for k, v in EXTRA[config][1].items())


DESCRIBE = {
    "baseline": "opdump not loaded",
    "off": "libopdump.so loaded, dumping off",
    "hook-only": "OPDUMP=1 OPDUMP_HOOK_ONLY=1 (the hook only redispatches)",
    "on": "OPDUMP=1, defaults",
    "on-noreuse": "OPDUMP=1 OPDUMP_REUSE=0",
    "peer": "Python TorchDispatchMode -> Parquet",
    "msprobe": "msprobe statistics, L1",
    "on-sync": "OPDUMP=1 OPDUMP_DEVICE_SYNC=1",
    "on-before": "OPDUMP=1, the --before-lib build",
    "on-nomodules": "OPDUMP=1 OPDUMP_MODULES=0 (no module hooks)",
    "on-source": "OPDUMP=1 OPDUMP_SOURCE=1 (source lines)",
    "on-sketch": "OPDUMP=1 OPDUMP_SKETCH=16 (fingerprint and sketch)",
    "on-reference": "OPDUMP=1 OPDUMP_REFERENCE=<an `on` dump of the same run> (online compare)",
    "on-reference-before": "on-reference, the --before-lib build",
}


# --------------------------------------------------------------------------
# The child: one configuration, one workload, one thread setting.
# --------------------------------------------------------------------------

def child(spec: dict) -> None:
    """Runs each workload of `spec` in turn in this process and prints one
    `BENCH {json}` line with a report per workload."""
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, str(ROOT / "scripts"))
    sys.path.insert(0, str(HERE))
    import tinylm

    cfg = spec.get("base", spec["config"])  # an --extra configuration behaves as its base
    if spec["threads"] == 1:
        torch.set_num_threads(1)
    out_dir = spec["out_dir"]
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    device = spec.get("device", "cpu")
    if device == "testdev":
        sys.path.insert(0, str(ROOT))
        import tests.testdev as testdev

        testdev.load(build=False)
        testdev.set_job_thread()

    if cfg in LOADING:
        torch.ops.load_library(spec["before_lib"] if cfg in BEFORE else spec.get("lib", str(LIB)))
    peer = debugger = None
    if cfg == "peer":
        from peer_dumper import PeerDumper
        peer = PeerDumper(out_dir)
        peer.__enter__()
    elif cfg == "msprobe":
        from msprobe.pytorch import PrecisionDebugger
        conf = Path(out_dir) / "msprobe-config.json"
        conf.write_text(json.dumps({
            "task": "statistics", "dump_path": str(Path(out_dir) / "dump"), "rank": [], "step": [],
            "level": "L1", "async_dump": False,
            "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics"},
        }))
        debugger = PrecisionDebugger(config_path=str(conf))

    def flush():
        if cfg in LOADING:
            torch.ops.opdump.flush()
        elif cfg == "peer":
            peer.flush()

    def counts() -> dict:
        """Op calls and rows written so far (after a flush)."""
        if cfg in DUMPING:
            written, dropped, failed = torch.ops.opdump.stats()
            return dict(op_calls=written, dropped=dropped, failed=failed, **_parquet_counts(out_dir))
        if cfg == "off":
            return dict(op_calls=torch.ops.opdump.stats()[0])
        if cfg == "hook-only":
            # Rows too: a build that ignores OPDUMP_HOOK_ONLY dumps, and must not
            # pass for an empty hook.
            return dict(op_calls=torch.ops.opdump.stats()[0], **_parquet_counts(out_dir))
        if cfg == "peer":
            return dict(op_calls=peer.ops_written, rows=peer.rows_written, files=peer.files)
        if cfg == "msprobe":
            return _msprobe_counts(Path(out_dir) / "dump")
        return {}

    reports = {}
    for wl in spec["workloads"]:
        w = WORKLOADS[wl]
        plan = spec["plan"][wl]
        model = tinylm.make(0, vocab=w["vocab"], d=w["d"], layers=w["layers"], heads=w["heads"], seq=w["seq"])
        model = model.to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        data = tinylm.batches(plan["warmup"] + plan["steps"], batch=w["batch"], seq=w["seq"], vocab=w["vocab"])
        data = [(x.to(device), y.to(device)) for x, y in data]

        def step(model, opt, x, y):
            if debugger is not None:
                debugger.start()
            opt.zero_grad()
            loss = F.cross_entropy(model(x).float().flatten(0, 1), y.flatten())
            loss.backward()
            opt.step()
            if debugger is not None:
                debugger.stop()
                debugger.step()

        def device_measured() -> int | None:
            """Device tensors opdump measured so far (None: not dumping, or
            a build without device_stats)."""
            if cfg not in DUMPING or not hasattr(torch.ops.opdump, "device_stats"):
                return None
            return int(torch.ops.opdump.device_stats()[0])

        flush()
        before = counts()
        times, cpu = [], []
        ran = 0
        t_start = None
        untimed = set()
        measured0 = None
        for i, (x, y) in enumerate(data):
            if i == plan["warmup"]:
                flush()  # the timed window starts with nothing queued or buffered
                # flush() completes every file: what comes after is the timed steps'.
                untimed = _dump_files(out_dir) if cfg in DUMPING else set()
                if device == "testdev":
                    # testdev's counts and opdump's measured tensors cover the
                    # timed steps and the final flush: not the warm-up steps.
                    testdev.reset_counters()
                    measured0 = device_measured()
            c0 = time.process_time()  # every thread of the process (opdump's writer too)
            t0 = time.perf_counter()
            step(model, opt, x, y)
            dt = time.perf_counter() - t0
            dc = time.process_time() - c0
            ran += 1
            if i >= plan["warmup"]:
                times.append(dt)
                cpu.append(dc)
                if t_start is None:
                    t_start = t0
                # A time budget bounds slow configurations (at least min_steps).
                if len(times) >= plan["min_steps"] and time.perf_counter() - t_start > plan["max_seconds"]:
                    break
        # What the timed steps left queued or buffered is written now, and
        # counted in the amortized step time.
        t0 = time.perf_counter()
        flush()
        flush_s = time.perf_counter() - t0
        after = counts()
        rep = {"times": times, "cpu": cpu, "steps_run": ran, "threads": torch.get_num_threads(),
               "flush_s": flush_s}
        if device == "testdev":
            # Host waits of the job's thread during the timed steps and the
            # final flush (counted by the test device), per timed step.
            rep["job_waits_per_step"] = testdev.host_waits()["job"] / len(times)
            # Launches over the same window; "observer" are opdump's own.
            rep["launches"] = testdev.launches()
            measured1 = device_measured()
            if measured0 is not None and measured1 is not None:
                rep["device_measured"] = measured1 - measured0
        for k, v in after.items():
            rep[k] = v - before.get(k, 0) if k not in ("dropped", "failed", "files") else v
        if cfg in DUMPING:
            try:
                rep.update(_measured_bytes(out_dir, untimed, len(times)))
            except Exception as e:  # any: the timings stand without it
                rep["measured_error"] = f"{type(e).__name__}: {e}"[:200]
        reports[wl] = rep
        del model, opt, data
    if peer is not None:
        peer.__exit__(None, None, None)
        peer.close()
    print("BENCH " + json.dumps(reports), flush=True)


def _parquet_counts(d: str) -> dict:
    import pyarrow.parquet as pq

    files = sorted(Path(d).rglob("*.parquet"))
    return {"files": len(files), "rows": sum(pq.ParquetFile(f).metadata.num_rows for f in files)}


def _dump_files(d: str) -> set:
    # Complete files only: those being written have hidden .tmp names.
    return set(Path(d).rglob("*.parquet"))


def _measured_bytes(d: str, untimed: set, steps: int) -> dict:
    """What opdump read to measure the timed steps, per step: numel × element
    size of every `computed` tensor row in the files written after the flush
    that opened the timed window. Rows it reused or took from a view cost no
    read. Also the dump's own count of those steps (its `step` column)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    import torch

    files = sorted(_dump_files(d) - untimed)
    if not files:
        return {"measured_bytes": 0.0, "measured_tensors": 0.0, "dump_steps": 0}
    t = pa.concat_tables(pq.read_table(f, columns=["step", "dtype", "numel", "stats_status"]) for f in files)
    dump_steps = len(pc.unique(t["step"]))
    t = t.filter(pc.and_(pc.equal(t["stats_status"], "computed"), pc.greater_equal(t["numel"], 0)))
    total, unknown = 0, []
    for row in t.group_by("dtype").aggregate([("numel", "sum")]).to_pylist():
        size = _element_size(torch, row["dtype"])
        if size is None:
            unknown.append(row["dtype"])
        else:
            total += row["numel_sum"] * size
    return {"measured_bytes": total / steps, "measured_tensors": t.num_rows / steps, "dump_steps": dump_steps,
            "unknown_dtypes": unknown}


def _element_size(torch, name: str | None) -> int | None:
    # The dump names dtypes as torch does (float32, bfloat16, complex64, ...).
    dtype = getattr(torch, name or "", None)
    return dtype.itemsize if isinstance(dtype, torch.dtype) else None


def bandwidth_child(spec: dict) -> None:
    """Prints `BW {json}`: this machine's read bandwidth, bytes/s, with one
    intra-op thread and with torch's default. A reduction over a float32
    buffer several times the last-level cache, so every byte comes from
    memory; the faster of sum and amax (the bound must not overstate what a
    read costs), median of the repeats."""
    import torch

    default = torch.get_num_threads()
    x = torch.ones(spec["bytes"] // 4, dtype=torch.float32)  # ones, not empty: every page is touched now
    out = {}
    for n in sorted({1, default}):
        torch.set_num_threads(n)
        best = 0.0
        for fn in (torch.sum, torch.amax):
            fn(x)  # the first call starts the thread pool
            ts = []
            for _ in range(spec["repeats"]):
                t0 = time.perf_counter()
                fn(x)
                ts.append(time.perf_counter() - t0)
            best = max(best, x.nbytes / statistics.median(ts))
        out[n] = best
    print("BW " + json.dumps({"bandwidth": out, "default_threads": default, "bytes": x.nbytes}), flush=True)


def _msprobe_counts(d: Path) -> dict:
    calls = tensors = 0
    files = 0
    for f in d.rglob("dump.json"):
        files += 1
        data = json.loads(f.read_text()).get("data", {})
        calls += len(data)

        def walk(v):
            nonlocal tensors
            if isinstance(v, dict):
                if v.get("type") == "torch.Tensor":
                    tensors += 1
                else:
                    for e in v.values():
                        walk(e)
            elif isinstance(v, list):
                for e in v:
                    walk(e)

        walk(data)
    return {"op_calls": calls, "rows": tensors, "files": files}


# --------------------------------------------------------------------------
# msprobe: its own venv that sees the project's torch.
# --------------------------------------------------------------------------

def ensure_msprobe(install: bool) -> tuple[str | None, str]:
    """(python, '') when msprobe runs here, else (None, reason)."""
    py = MSPROBE_VENV / "bin" / "python"
    check = "import torch, msprobe.pytorch; print(torch.__version__)"
    if py.exists():
        r = subprocess.run([str(py), "-c", check], capture_output=True, text=True, cwd="/tmp")
        if r.returncode == 0:
            return str(py), ""
        if not install:
            return None, "import failed: " + _last_line(r.stderr)
    if not install:
        return None, f"no venv at {MSPROBE_VENV} (run without --no-msprobe-install to create it)"
    print(f"bench: installing mindstudio-probe into {MSPROBE_VENV} (once) ...", file=sys.stderr, flush=True)
    try:
        subprocess.run([str(VENV_PY), "-m", "venv", "--system-site-packages", str(MSPROBE_VENV)],
                       check=True, capture_output=True, text=True)
        # A venv made from a venv sees the base interpreter's packages, not the
        # project venv's: point it at the project's site-packages (torch), after
        # its own (msprobe and its dependencies win).
        site = subprocess.run([str(VENV_PY), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              check=True, capture_output=True, text=True).stdout.strip()
        own = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
        Path(own, "zz_opdump_project_torch.pth").write_text(site + "\n")
        r = subprocess.run([str(py), "-m", "pip", "install", "-q", "mindstudio-probe"],
                           capture_output=True, text=True, timeout=900)
        if r.returncode != 0:
            return None, "pip install mindstudio-probe failed: " + _last_line(r.stderr)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as e:
        return None, f"venv/pip failed: {e}"
    r = subprocess.run([str(py), "-c", check], capture_output=True, text=True, cwd="/tmp")
    if r.returncode != 0:
        return None, "import failed: " + _last_line(r.stderr)
    return str(py), ""


def _last_line(s: str) -> str:
    lines = [l for l in s.strip().splitlines() if l.strip()]
    return lines[-1][:200] if lines else "(no message)"


# --------------------------------------------------------------------------
# The parent.
# --------------------------------------------------------------------------

def clean_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPDUMP")}
    env.pop("LD_PRELOAD", None)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def reference_for(py: str, spec: dict, tmp: Path, timeout: float) -> Path:
    """The dump an `on-reference` child is judged against: the same child
    run as `on`, made once per thread setting and set of workloads."""
    ref = tmp / f"reference-t{spec['threads']}-{'-'.join(spec['workloads'])}"
    if not ref.exists():
        run_child(py, dict(spec, config="on", base="on", keep_as=str(ref)), tmp, timeout)
    return ref


def run_child(py: str, spec: dict, tmp: Path, timeout: float) -> dict:
    """{workload: report}; on failure {workload: {"error": ...}}."""
    out = tmp / f"{spec['config']}-t{spec['threads']}-r{spec['repeat']}"
    spec = dict(spec, out_dir=str(out))
    env = clean_env()
    env.update(spec.get("env", {}))
    cfg = spec.get("base", spec["config"])
    if cfg in ("on-reference", "on-reference-before"):
        env["OPDUMP_REFERENCE"] = str(reference_for(py, spec, tmp, timeout))
    if cfg in DUMPING or cfg == "hook-only":
        env.update(OPDUMP="1", OPDUMP_DIR=str(out))
        if cfg == "hook-only":
            env["OPDUMP_HOOK_ONLY"] = "1"
        if cfg == "on-noreuse":
            env["OPDUMP_REUSE"] = "0"
        if cfg == "on-sync":
            env["OPDUMP_DEVICE_SYNC"] = "1"
        if cfg == "on-nomodules":
            env["OPDUMP_MODULES"] = "0"
        if cfg == "on-source":
            env["OPDUMP_SOURCE"] = "1"
        if cfg == "on-sketch":
            env["OPDUMP_SKETCH"] = "16"
    env.update(spec.get("extra_env", {}))
    opdump_lines = []
    try:
        r = subprocess.run([py, str(Path(__file__).resolve()), "--child", json.dumps(spec)],
                           capture_output=True, text=True, env=env, cwd=str(tmp), timeout=timeout)
        lines = [l for l in r.stdout.splitlines() if l.startswith("BENCH ")]
        opdump_lines = sorted({l.strip() for l in r.stderr.splitlines() if l.startswith("opdump:")})
        if r.returncode != 0 or not lines:
            reps = {wl: {"error": f"exit {r.returncode}: {_last_line(r.stderr)}"} for wl in spec["workloads"]}
        else:
            reps = json.loads(lines[-1][6:])
    except subprocess.TimeoutExpired:
        reps = {wl: {"error": f"timed out after {timeout:.0f}s"} for wl in spec["workloads"]}
    finally:
        if spec.get("keep_as"):
            shutil.move(str(out), spec["keep_as"])
        else:
            shutil.rmtree(out, ignore_errors=True)
    for rep in reps.values():
        rep["opdump_lines"] = opdump_lines
    return reps


def fmt_ms(s: float) -> str:
    ms = s * 1e3
    return f"{ms:.1f}" if ms >= 10 else f"{ms:.2f}"


def plans(args) -> dict:
    tiny = dict(warmup=args.warmup, steps=args.steps, min_steps=args.min_steps, max_seconds=args.max_seconds)
    return {
        "tiny": tiny,
        "tiny-v1000": tiny,
        "large": dict(warmup=args.large_warmup, steps=args.large_steps, min_steps=args.min_steps,
                      max_seconds=args.large_max_seconds),
        "testdev": dict(warmup=args.warmup, steps=args.steps, min_steps=args.min_steps,
                        max_seconds=args.testdev_max_seconds),
    }


def bench_threads(threads: int, workloads: list[str], configs: list[str], args, py_for: dict,
                  tmp: Path, device: dict | None = None) -> list[str]:
    """Every configuration, `args.repeats` times, interleaved; each child runs
    every workload in turn. Returns the tables, one per workload. `device`:
    the test device's settings ({"title", "env"}) for the device tables."""
    plan = {wl: p for wl, p in plans(args).items() if wl in workloads}
    results = {wl: {c: [] for c in configs} for wl in workloads}
    for rep in range(args.repeats):
        k = rep % len(configs)
        order = configs[k:] + configs[:k]
        for c in order:
            spec = dict(config=c, threads=threads, repeat=rep, workloads=workloads, plan=plan, lib=args.lib,
                        before_lib=args.before_lib_copy)
            if device:
                spec.update(device="testdev", env=device["env"])
            if c in EXTRA:
                spec.update(base=EXTRA[c][0], extra_env=EXTRA[c][1])
            t0 = time.time()
            reps = run_child(py_for[c], spec, tmp, args.child_timeout)
            msgs = []
            for wl in workloads:
                r = reps.get(wl, {"error": "no report"})
                results[wl][c].append(r)
                msgs.append(f"{wl} " + (r.get("error") or
                            f"{fmt_ms(statistics.median(r['times']))} ms ({len(r['times'])} steps)"))
            print(f"  [threads={threads if threads else 'default'} rep {rep + 1}/{args.repeats}] {c:<11} "
                  f"{'; '.join(msgs)} ({time.time() - t0:.1f}s)", file=sys.stderr, flush=True)
    lines = []
    for wl in workloads:
        lines += render(wl, threads, configs, results[wl], plan[wl], args, device)
    return lines


def render(workload: str, threads: int, configs: list[str], results: dict, plan: dict, args,
           device: dict | None = None) -> list[str]:
    w = WORKLOADS[workload]
    warmup, steps, max_s = plan["warmup"], plan["steps"], plan["max_seconds"]
    tname = "1 (torch.set_num_threads(1))" if threads == 1 else "default"
    nthreads = {r.get("threads") for rs in results.values() for r in rs if "threads" in r}
    if threads != 1 and nthreads:
        tname += f" ({'/'.join(str(n) for n in sorted(nthreads))})"
    on_device = f" on {device['title']}" if device else ""
    lines = [
        f"### {workload}: TinyLM d={w['d']}, {w['layers']} blocks, {w['heads']} heads, seq {w['seq']}, "
        f"batch {w['batch']}, vocab {w['vocab']}, AdamW{on_device}; intra-op threads: {tname}",
        f"{args.repeats} repeats, configuration order rotated each repeat; each: {warmup} warm-up steps, "
        f"then up to {steps} timed steps (at least {args.min_steps}, stopping after {max_s:g} s).",
        "",
        "| config | what | median ms/step | ratio | amortized ms/step | ratio | CPU ms/step | ratio "
        "| repeat medians min–max (ms) | op calls/step | rows/step | files (process) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    base = base_am = base_cpu = None
    meds, ams, cpus = {}, {}, {}
    notes = []
    for c in configs:
        rs = results[c]
        good = [r for r in rs if "times" in r and r["times"]]
        errs = sorted({r["error"] for r in rs if "error" in r})
        for r in rs:
            for l in r.get("opdump_lines", []):
                if f"{c}: {l}" not in notes:
                    notes.append(f"{c}: {l}")
        if not good:
            lines.append(f"| {c} | {DESCRIBE[c]} | failed | | | | | | {'; '.join(errs)[:120]} | | | |")
            continue
        per_rep = [statistics.median(r["times"]) for r in good]
        # Amortized: the timed steps plus writing out what they left buffered.
        per_rep_am = [(sum(r["times"]) + r.get("flush_s", 0.0)) / len(r["times"]) for r in good]
        per_rep_cpu = [statistics.median(r["cpu"]) for r in good]
        med, am, cp = statistics.median(per_rep), statistics.median(per_rep_am), statistics.median(per_rep_cpu)
        meds[c], ams[c], cpus[c] = med, am, cp
        if c == "baseline":
            base, base_am, base_cpu = med, am, cp
        ratio = f"{med / base:.2f}×" if base else "n/a"
        ratio_am = f"{am / base_am:.2f}×" if base_am else "n/a"
        ratio_cpu = f"{cp / base_cpu:.2f}×" if base_cpu else "n/a"
        steps_run = [r["steps_run"] for r in good]
        calls = [r["op_calls"] / r["steps_run"] for r in good if r.get("op_calls") is not None]
        rows = [r["rows"] / r["steps_run"] for r in good if r.get("rows") is not None]
        files = [r["files"] for r in good if r.get("files") is not None]
        calls_s = f"{statistics.median(calls):.0f}" if calls else "–"
        rows_s = f"{statistics.median(rows):.0f}" if rows else "–"
        files_s = f"{statistics.median(files):.0f}" if files else "–"
        lines.append(f"| {c} | {DESCRIBE[c]} | {fmt_ms(med)} | {ratio} | {fmt_ms(am)} | {ratio_am} | "
                     f"{fmt_ms(cp)} | {ratio_cpu} | "
                     f"{fmt_ms(min(per_rep))}–{fmt_ms(max(per_rep))} | {calls_s} | {rows_s} | {files_s} |")
        if errs:
            notes.append(f"{c}: {len(rs) - len(good)} of {len(rs)} runs failed: {'; '.join(errs)[:200]}")
        drops = [r.get("dropped", 0) + r.get("failed", 0) for r in good]
        if any(drops):
            notes.append(f"{c}: dropped+failed op calls per run: {drops}")
        if base_of(c) in DUMPING or c == "peer":
            fl = statistics.median(r.get("flush_s", 0.0) for r in good)
            nt = statistics.median(len(r["times"]) for r in good)
            notes.append(f"{c}: final flush after the timed steps: median {fl * 1e3:.0f} ms "
                         f"(over a median of {nt:g} timed steps); processes ran {min(steps_run)}–{max(steps_run)} "
                         f"steps incl. warm-up")
    for k, what in (("peer", "the Python peer"), ("msprobe", "msprobe")):
        if "on" in meds and k in meds:
            notes.append(f"{k} / on = {meds[k] / meds['on']:.2f}× median, {ams[k] / ams['on']:.2f}× amortized "
                         f"(how many times slower {what} is than opdump)")
    if "on" in meds and "on-noreuse" in meds:
        notes.append(f"on-noreuse / on = {meds['on-noreuse'] / meds['on']:.2f}× (what reuse and view shortcuts buy)")
    if "on" in meds and "on-sync" in meds:
        notes.append(f"on-sync / on = {meds['on-sync'] / meds['on']:.2f}× (what not waiting for the device buys)")
    if "on" in meds and "on-nomodules" in meds:
        notes.append(f"on / on-nomodules = {meds['on'] / meds['on-nomodules']:.2f}× (what the module hooks cost)")
    if "on" in meds and "on-sketch" in meds:
        notes.append(f"on-sketch / on = {meds['on-sketch'] / meds['on']:.2f}× (what the fingerprint and sketch cost)")
    if "on" in meds and "on-reference" in meds:
        notes.append(f"on-reference / on = {meds['on-reference'] / meds['on']:.2f}× (what online compare costs; "
                     "goal ≤ 1.15×)")
    if "on" in meds and "on-source" in meds:
        notes.append(f"on-source / on = {meds['on-source'] / meds['on']:.2f}× (what OPDUMP_SOURCE=1 costs)")
    if "on" in meds and "on-before" in meds:
        notes.append(f"on-before / on = {meds['on-before'] / meds['on']:.2f}× "
                     "(the --before-lib build against this one)")
    for c in configs:
        b = base_of(c)
        if c in EXTRA and c in meds and b in meds:
            notes.append(f"{c} / {b} = {meds[c] / meds[b]:.2f}× (what {extra_vars(c)} changes); "
                         f"{c} − {b} = {(meds[c] - meds[b]) * 1e3:+.1f} ms a step")
    if device:
        waits = {c: statistics.median(r["job_waits_per_step"] for r in results[c] if "job_waits_per_step" in r)
                 for c in configs if any("job_waits_per_step" in r for r in results[c])}
        notes.append("host waits of the job's thread per step (testdev's count, median): "
                     + ", ".join(f"{c} {v:.1f}" for c, v in waits.items()))
    SUMMARY["groups"][(workload, threads, device["key"] if device else None)] = (meds, ams, cpus)
    if notes:
        lines.append("")
        lines.extend(f"- {n}" for n in notes)
    lines.append("")
    if device:
        lines += device_cost_table(configs, results, meds, device)
    else:
        lines += bound_table(workload, threads, results, meds)
    return lines


def device_cost_table(configs: list[str], results: dict, meds: dict, device: dict) -> list[str]:
    """Per dumping configuration, what one measured device tensor costs:
    opdump's launches (testdev's observer count) and the job's thread's time
    (added median step time over the measured tensors a step). Both over the
    timed steps and the final flush; medians over the repeats."""
    rows, costs = [], {}
    for c in configs:
        if base_of(c) not in DUMPING:
            continue
        good = [r for r in results[c] if r.get("times") and "device_measured" in r and "launches" in r]
        if not good:
            why = sorted({r.get("error", "no count of measured tensors (device_stats)") for r in results[c]})
            rows.append(f"| {c} | – | – | – | {'; '.join(why)[:120]} |")
            continue
        per_step = statistics.median(r["device_measured"] / len(r["times"]) for r in good)
        launches = [r["launches"]["observer"] / r["device_measured"] for r in good if r["device_measured"]]
        per_tensor = statistics.median(launches) if launches else None
        host_us = (meds[c] - meds["baseline"]) / per_step * 1e6 if "baseline" in meds and c in meds and per_step \
            else None
        costs[c] = {"measured_per_step": per_step, "launches_per_measured": per_tensor,
                    "host_us_per_measured": host_us}
        observer = statistics.median(r["launches"]["observer"] / len(r["times"]) for r in good)
        rows.append(f"| {c} | {per_step:,.0f} | {observer:,.0f} | "
                    f"{'–' if per_tensor is None else f'{per_tensor:,.2f}'} | "
                    f"{'–' if host_us is None else f'{host_us:,.2f}'} |")
    SUMMARY.setdefault("device_costs", {})[device["key"]] = costs
    if not rows:
        return []
    return [f"**What a measured device tensor costs, {device['key']}** (timed steps and final flush, median of "
            f"the repeats; testdev at {SUMMARY['testdev_launch_us']:g} µs per launch, as the baseline):", "",
            "| config | measured tensors/step (device_stats) | opdump's launches/step (testdev observer) "
            "| opdump's launches / measured tensor | job's thread µs / measured tensor ((median − baseline) ÷ "
            "measured/step) |",
            "|---|---:|---:|---:|---:|"] + rows + [""]


# --------------------------------------------------------------------------
# The physical limit: what any dumper must add to a step, at least.
# --------------------------------------------------------------------------

def bound_table(workload: str, threads: int, results: dict, meds: dict) -> list[str]:
    """opdump's added time per step next to a lower bound on any dumper's:
    the bytes opdump read to measure (its `on` dump) at this machine's read
    bandwidth, plus an empty hook on each op call."""
    bw = SUMMARY.get("bandwidth")
    title = f"**Physical limit, {workload}, {'1 thread' if threads == 1 else 'default threads'}**"
    if "baseline" not in meds or "on" not in meds:
        return []
    if not bw:
        return [f"{title}: not computed ({SUMMARY.get('bandwidth_why', 'no bandwidth measured')}).", ""]
    on = [r for r in results["on"] if "measured_bytes" in r]
    if not on:
        why = sorted({r["measured_error"] for r in results["on"] if "measured_error" in r})
        return [f"{title}: not computed (the `on` dump could not be read: {'; '.join(why) or 'no report'}).", ""]
    nbytes = statistics.median(r["measured_bytes"] for r in on)
    tensors = statistics.median(r["measured_tensors"] for r in on)
    calls = statistics.median(r["op_calls"] / r["steps_run"] for r in on)
    added = meds["on"] - meds["baseline"]
    hook, hook_note = empty_hook(results, meds, calls)
    lines = [f"{title}: the `on` dump's `computed` tensors (numel × element size) come to "
             f"{nbytes / 2**20:,.1f} MiB a timed step ({tensors:,.0f} tensors, {calls:,.0f} op calls); "
             f"{hook_note}.", "",
             "| read bandwidth of | GB/s | bytes / bandwidth, ms | + empty hook × calls, ms | = bound, ms/step "
             "| opdump adds (on − baseline), ms/step | added / bound |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for n, rate in sorted(bw.items()):
        read = nbytes / rate
        bound = read + (hook or 0.0)
        hook_s = "not run" if hook is None else f"{hook * 1e3:.2f}"
        ratio = f"{added / bound:.1f}×" if bound > 0 else "–"
        if n == 1 and bound > 0 and hook is not None:  # the goals table's "added / limit"
            SUMMARY.setdefault("added_over_bound", {})[(workload, threads)] = added / bound
        lines.append(f"| {'1 thread' if n == 1 else f'all {n} threads'} | {rate / 1e9:.1f} | {read * 1e3:.2f} "
                     f"| {hook_s} | {bound * 1e3:.2f} | {added * 1e3:.2f} | {ratio} |")
    lines += _bound_caveats(on, hook)
    return lines + [""]


def empty_hook(results: dict, meds: dict, calls: float) -> tuple[float | None, str]:
    """(seconds a step that `calls` op calls spend in an empty hook, or None;
    how it was found). The hook's cost per call is hook-only's added time
    over the calls it saw (its own count when the build gives one, else
    `on`'s recorded calls)."""
    if "hook-only" not in meds:
        return None, f"empty hook: not run ({SUMMARY.get('hook_only_why', 'hook-only not in --configs')})"
    good = [r for r in results["hook-only"] if r.get("times")]
    if any(r.get("rows") for r in good):
        return None, "empty hook: not run (hook-only wrote rows: this build does not honour OPDUMP_HOOK_ONLY)"
    seen = [r["op_calls"] / r["steps_run"] for r in good if r.get("op_calls")]
    hooked = statistics.median(seen) if seen else calls
    added = meds["hook-only"] - meds["baseline"]
    # Noise can put hook-only below the baseline: the hook then counts as free.
    per_call = max(added, 0.0) / hooked if hooked else 0.0
    counted = "its own count" if seen else "as many as on recorded"
    noise = " (below the baseline: noise, counted as 0)" if added < 0 else ""
    return calls * per_call, (f"empty hook: hook-only − baseline = {added * 1e3:.2f} ms a step{noise} over "
                              f"{hooked:,.0f} calls ({counted}), {per_call * 1e6:.2f} µs a call")


def _bound_caveats(on: list, hook: float | None) -> list[str]:
    notes = []
    steps = {(r["dump_steps"], len(r["times"])) for r in on}
    if any(d != t for d, t in steps):
        notes.append("the dump's timed files hold a different number of steps than were timed "
                     f"(dump, timed: {sorted(steps)}): the bytes per step may be off")
    unknown = sorted({d for r in on for d in r.get("unknown_dtypes", [])})
    if unknown:
        notes.append(f"dtypes of unknown size, left out of the bytes: {', '.join(map(str, unknown))}")
    if hook is None:
        notes.append("the bound is the read alone: without hook-only it leaves out the hook's cost per call")
    return [""] + [f"- {n}" for n in notes] if notes else []


def llc_bytes() -> int:
    """The largest CPU cache that sysfs or glibc (`getconf`) reports, else
    32 MiB. The larger of the two: in a VM they can disagree (32 MiB against
    320 MiB on the development machine), and a buffer that fits a cache
    would overstate the bandwidth of memory."""
    sizes = []
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        m = re.fullmatch(r"(\d+)([KMG]?)", f.read_text().strip())
        if m:
            sizes.append(int(m.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[m.group(2)])
    try:  # Python's os.sysconf does not know the cache names
        out = subprocess.run(["getconf", "LEVEL3_CACHE_SIZE"], capture_output=True, text=True).stdout.strip()
        sizes.append(int(out) if out.isdigit() else 0)
    except OSError:
        pass
    return max(sizes + [0]) or 32 * 2**20


def measure_bandwidth(args, tmp: Path) -> list[str]:
    """Runs the bandwidth child; sets SUMMARY["bandwidth"] ({threads:
    bytes/s}) and returns the report's line about it."""
    llc = llc_bytes()
    buf = args.bw_mib * 2**20 if args.bw_mib else max(4 * llc, 256 * 2**20)
    # Never more than a quarter of the free memory.
    buf = min(buf, os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 4)
    spec = {"bytes": int(buf), "repeats": args.bw_repeats}
    print(f"bench: read bandwidth over {buf / 2**20:,.0f} MiB", file=sys.stderr, flush=True)
    r = subprocess.run([str(VENV_PY), str(Path(__file__).resolve()), "--bandwidth", json.dumps(spec)],
                       capture_output=True, text=True, env=clean_env(), cwd=str(tmp), timeout=args.child_timeout)
    lines = [l for l in r.stdout.splitlines() if l.startswith("BW ")]
    if r.returncode != 0 or not lines:
        SUMMARY["bandwidth_why"] = f"bandwidth measurement failed: {_last_line(r.stderr)}"
        return [f"- read bandwidth: {SUMMARY['bandwidth_why']}"]
    got = json.loads(lines[-1][3:])
    SUMMARY["bandwidth"] = {int(n): v for n, v in got["bandwidth"].items()}
    rates = ", ".join(f"{v / 1e9:.1f} GB/s with {n} thread{'s' if n > 1 else ''}"
                      for n, v in sorted(SUMMARY["bandwidth"].items()))
    return [f"- read bandwidth: {rates} (the faster of torch.sum and torch.amax over a "
            f"{got['bytes'] / 2**20:,.0f} MiB float32 buffer, last-level cache {llc / 2**20:,.0f} MiB, "
            f"median of {args.bw_repeats} repeats)"]


def hook_only_support(tmp: Path, lib: str) -> str:
    """'' when this build honours OPDUMP_HOOK_ONLY=1 (no warning about the
    name, nothing written), else why not. One short process, before the
    repeats, so that an unsupported configuration costs no repeats."""
    out = tmp / "hook-probe"
    code = (f"import torch; torch.ops.load_library({lib!r}); x = torch.ones(64); (x + 1).sum(); "
            "torch.ops.opdump.flush()")
    env = dict(clean_env(), OPDUMP="1", OPDUMP_HOOK_ONLY="1", OPDUMP_DIR=str(out))
    r = subprocess.run([str(VENV_PY), "-c", code], capture_output=True, text=True, env=env, cwd=str(tmp),
                       timeout=120)
    rows = _rows_of([out])[0] if out.exists() else 0
    shutil.rmtree(out, ignore_errors=True)
    if r.returncode != 0:
        return f"the probe failed: {_last_line(r.stderr)}"
    if "OPDUMP_HOOK_ONLY is not an opdump variable" in r.stderr:
        return "this build does not know OPDUMP_HOOK_ONLY"
    if rows:
        return f"with OPDUMP_HOOK_ONLY=1 this build still wrote {rows} rows"
    return ""


# Figures for the goal table: {"groups": {(workload, threads): (medians, amortized)},
# "writer": rows/s, "compare": (seconds, MiB)}; and per device table (TESTDEV_SETTINGS
# key) "device_costs": {config: {"measured_per_step", "launches_per_measured",
# "host_us_per_measured"}}.
SUMMARY: dict = {"groups": {}}


# The step-time goals per workload and thread setting (1, or 0 for torch's
# default); the rest have the general one, 1.5×.
STEP_GOALS = {("tiny", 1): 1.25, ("tiny", 0): 1.5, ("tiny-v1000", 1): 1.5, ("large", 0): 1.25}
# What opdump adds over the physical limit (one thread's bandwidth).
ADDED_OVER_BOUND_GOAL = 3.0


def goal_table() -> list[str]:
    rows = []
    groups = SUMMARY["groups"]

    def tname(t):
        return "1 thread" if t == 1 else "default threads"

    for (wl, t, dev), (meds, ams, cpus) in groups.items():
        base, base_am, base_cpu = meds.get("baseline"), ams.get("baseline"), cpus.get("baseline")
        if dev:
            wl = (f"{wl} ({dev}, {SUMMARY['testdev_sync_us']:g} µs per host wait, "
                  f"{SUMMARY['testdev_launch_us']:g} µs per launch)")
        if base and "off" in meds:
            r, rc = meds["off"] / base, cpus["off"] / base_cpu
            rows.append(f"| loaded but off, {wl}, {tname(t)} | ≤ 1.02× | {r:.2f}× (CPU time {rc:.2f}×) "
                        f"| {'met' if r <= 1.02 else 'not met'} |")
        if base and "on" in meds:
            r, ra, rc = meds["on"] / base, ams["on"] / base_am, cpus["on"] / base_cpu
            goal = 1.5 if dev else STEP_GOALS.get((wl, t), 1.5)
            rows.append(f"| dumping on (defaults), {wl}, {tname(t)} | ≤ {goal:g}× | {r:.2f}× "
                        f"(amortized {ra:.2f}×, CPU time {rc:.2f}×) | {'met' if r <= goal else 'not met'} |")
        over = SUMMARY.get("added_over_bound", {}).get((wl, t)) if not dev else None
        if over is not None:
            rows.append(f"| added time / physical limit (one thread's bandwidth), {wl}, {tname(t)} "
                        f"| ≤ {ADDED_OVER_BOUND_GOAL:g}× | {over:.1f}× "
                        f"| {'met' if over <= ADDED_OVER_BOUND_GOAL else 'not met'} |")
        if "on" in meds and "peer" in meds:
            r = meds["peer"] / meds["on"]
            rows.append(f"| opdump faster than the Python peer, {wl}, {tname(t)} | ≥ 2× | {r:.2f}× "
                        f"| {'met' if r >= 2 else 'not met'} |")
        if "on" in meds and "msprobe" in meds:
            r = meds["msprobe"] / meds["on"]
            rows.append(f"| (for reference) opdump faster than msprobe, {wl}, {tname(t)} | – | {r:.2f}× | |")
    if "writer" in SUMMARY:
        r = SUMMARY["writer"]
        rows.append(f"| writer throughput (RotatingWriter, one thread) | ≥ 1,000,000 rows/s | {r:,.0f} rows/s "
                    f"| {'met' if r >= 1e6 else 'not met'} |")
    if "compare" in SUMMARY:
        secs, mib, n = SUMMARY["compare"]
        rows.append(f"| opdump compare, {n:,} vs {n:,} op calls (goal: 1M) | ≤ 10 s, memory bounded "
                    f"| {secs:.1f} s, peak RSS {mib:.0f} MiB | {'met' if secs <= 10 else 'not met'} (time) |")
    if not rows:
        return []
    return ["### Goals against this run", "", "| figure | goal | measured | |", "|---|---|---|---|"] \
        + rows + [""]


# --------------------------------------------------------------------------
# The parts: writer throughput and compare.
# --------------------------------------------------------------------------

def cargo_env() -> dict:
    env = dict(os.environ)
    env.setdefault("CARGO_TARGET_DIR", str(ROOT / "target"))
    return env


def writer_bench(args, tmp: Path) -> list[str]:
    pkg = HERE / "writer-bench"
    lines = ["### Writer throughput (scripts/bench/writer-bench)", ""]
    b = subprocess.run(["cargo", "build", "--release", "--quiet", "--manifest-path", str(pkg / "Cargo.toml")],
                       capture_output=True, text=True, env=cargo_env())
    if b.returncode != 0:
        return lines + [f"not run: build failed: {_last_line(b.stderr)}", ""]
    exe = Path(cargo_env()["CARGO_TARGET_DIR"]) / "release" / "writer-bench"
    cmd = [str(exe), "--dir", str(tmp / "writer"), "--ops", str(args.writer_ops), "--runs", "3"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    shutil.rmtree(tmp / "writer", ignore_errors=True)
    if r.returncode != 0:
        return lines + [f"failed: {_last_line(r.stderr)}", ""]
    m = re.search(r"^\| writer \(build[^|]*\| [\d.]+ \| (\d+) \|", r.stdout, re.M)
    if m:
        SUMMARY["writer"] = float(m.group(1))
    lines.append("`" + " ".join(["writer-bench"] + cmd[1:]).replace(str(tmp), "$TMP") + "`")
    lines.append("")
    lines.extend(r.stdout.rstrip().splitlines())
    lines.append("")
    return lines


def compare_bench(args, tmp: Path) -> list[str]:
    lines = [f"### opdump compare on two synthetic dumps of {args.compare_ops:,} op calls each", ""]
    b = subprocess.run(["cargo", "build", "--release", "--quiet", "-p", "opdump-testkit", "-p", "opdump-cli",
                        "--example", "synth", "--bin", "opdump"],
                       cwd=str(ROOT), capture_output=True, text=True, env=cargo_env())
    if b.returncode != 0:
        return lines + [f"not run: build of the synth example failed: {_last_line(b.stderr)}", ""]
    synth = Path(cargo_env()["CARGO_TARGET_DIR"]) / "release" / "examples" / "synth"
    a, bdir = tmp / "cmp-a", tmp / "cmp-b"
    t0 = time.perf_counter()
    g = subprocess.run([str(synth), str(a), str(bdir), str(args.compare_ops)], capture_output=True, text=True)
    if g.returncode != 0:
        return lines + [f"not run: synth failed: {_last_line(g.stderr)}", ""]
    gen_s = time.perf_counter() - t0
    size = sum(f.stat().st_size for f in tmp.rglob("*.parquet"))
    rows = _rows_of([a, bdir])
    runs = []
    verdict = ""
    for _ in range(args.compare_runs):
        t0 = time.perf_counter()
        r = subprocess.run(["/usr/bin/time", "-v", str(OPDUMP_CLI), "compare", str(a), str(bdir)],
                           capture_output=True, text=True)
        secs = time.perf_counter() - t0
        m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr)
        rss = int(m.group(1)) / 1024 if m else float("nan")
        runs.append((secs, rss, r.returncode))
        verdict = " / ".join(l.strip() for l in r.stdout.splitlines()
                             if l.strip().startswith(("A  /", "B  /", "aligned:", "First divergence")))
    shutil.rmtree(a, ignore_errors=True)
    shutil.rmtree(bdir, ignore_errors=True)
    secs = statistics.median(s for s, _, _ in runs)
    rss = max(m for _, m, _ in runs)
    codes = sorted({c for _, _, c in runs})
    SUMMARY["compare"] = (secs, rss, args.compare_ops)
    lines += [
        f"`synth A B {args.compare_ops}` (crates/testkit/examples/synth.rs) wrote {rows[0]:,} + {rows[1]:,} rows "
        f"({size / 2**20:.0f} MiB of Parquet) in {gen_s:.1f} s; then `/usr/bin/time -v opdump compare A B`, "
        f"{args.compare_runs} runs:",
        "",
        "| figure | value |",
        "|---|---:|",
        f"| wall time, median | {secs:.2f} s |",
        f"| wall time, runs | {', '.join(f'{s:.2f}' for s, _, _ in runs)} s |",
        f"| peak RSS (max of runs) | {rss:.0f} MiB |",
        f"| exit code | {', '.join(map(str, codes))} (1: diverged, as planted; 2: error) |",
        "",
        f"its report: `{verdict.replace(str(tmp), '$TMP')[:400]}`",
        "",
    ]
    return lines


def _rows_of(dirs) -> list[int]:
    import pyarrow.parquet as pq

    return [sum(pq.ParquetFile(f).metadata.num_rows for f in Path(d).rglob("*.parquet")) for d in dirs]


def prepare_bound(configs: list[str], args, tmp: Path) -> list[str]:
    """Before the repeats: leaves hook-only out when this build does not
    support it, and measures the read bandwidth when a physical limit will be
    printed. Returns the report's header lines about both."""
    lines = []
    if "hook-only" in configs:
        why = hook_only_support(tmp, args.lib)
        if why:
            configs.remove("hook-only")
            SUMMARY["hook_only_why"] = why
            lines.append(f"- hook-only: not run ({why}); the physical limit leaves out the hook's cost")
    if "baseline" in configs and "on" in configs and args.threads.strip(","):
        lines += measure_bandwidth(args, tmp)
    return lines


# --------------------------------------------------------------------------

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--bandwidth", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true",
                    help="TinyLM only, one intra-op thread, fewer steps; skips the parts")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--workloads", default="tiny,tiny-v1000,large",
                    help="comma list of: " + ", ".join(w for w in WORKLOADS if w != "testdev"))
    ap.add_argument("--threads", default="1,default", help="comma list of 1 and/or default")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--extra", action="append", default=[], metavar="NAME=BASE,VAR=VALUE,...",
                    help="one more configuration, NAME: the configuration BASE (" + ", ".join(EXTRA_BASES) +
                         ") with VAR=VALUE added to its environment, e.g. "
                         "on-passive=on,OMP_WAIT_POLICY=PASSIVE; repeatable; run beside --configs")
    ap.add_argument("--warmup", type=int, default=2, help="TinyLM (tiny, tiny-v1000) warm-up steps")
    ap.add_argument("--steps", type=int, default=30, help="TinyLM (tiny, tiny-v1000) timed steps (at most)")
    ap.add_argument("--max-seconds", type=float, default=2.0,
                    help="TinyLM (tiny, tiny-v1000): stop timing after this long")
    ap.add_argument("--large-warmup", type=int, default=1)
    ap.add_argument("--large-steps", type=int, default=4)
    ap.add_argument("--large-max-seconds", type=float, default=2.5)
    ap.add_argument("--min-steps", type=int, default=3)
    ap.add_argument("--child-timeout", type=float, default=300)
    ap.add_argument("--bw-repeats", type=int, default=7,
                    help="physical limit: repeats of each reduction that measures the read bandwidth")
    ap.add_argument("--bw-mib", type=int, default=0,
                    help="physical limit: the bandwidth buffer in MiB (default: 4x the last-level cache, "
                         "at least 256 MiB)")
    ap.add_argument("--no-msprobe-install", action="store_true",
                    help=f"use msprobe only if {MSPROBE_VENV} already has it")
    ap.add_argument("--no-parts", action="store_true", help="skip the writer and compare benchmarks")
    ap.add_argument("--parts-only", action="store_true", help="only the writer and compare benchmarks")
    ap.add_argument("--writer-ops", type=int, default=1_000_000)
    ap.add_argument("--compare-ops", type=int, default=1_000_000)
    ap.add_argument("--compare-runs", type=int, default=2)
    ap.add_argument("--out", help="also write the report (markdown) to this file")
    ap.add_argument("--no-testdev", action="store_true", help="skip the device tables on testdev")
    ap.add_argument("--testdev-only", action="store_true", help="only the device tables on testdev")
    ap.add_argument("--testdev-sync-us", type=float, default=20,
                    help="device tables: simulated cost of each host wait on testdev (TESTDEV_SYNC_US)")
    ap.add_argument("--testdev-launch-us", type=float, default=5,
                    help="device tables: simulated cost of each kernel launch on testdev (TESTDEV_LAUNCH_US)")
    ap.add_argument("--testdev-settings", default=",".join(TESTDEV_SETTINGS),
                    help="device tables, a comma list of: " + ", ".join(TESTDEV_SETTINGS))
    ap.add_argument("--testdev-configs", default=",".join(DEVICE_CONFIGS))
    ap.add_argument("--testdev-max-seconds", type=float, default=3.0)
    ap.add_argument("--before-lib", help="an earlier build's libopdump.so (with its libopdump_core.so beside it) "
                                         "for the on-before configuration; without it on-before is left out")
    args = ap.parse_args()

    if args.child:
        child(json.loads(args.child))
        return 0
    if args.bandwidth:
        bandwidth_child(json.loads(args.bandwidth))
        return 0
    # SIGTERM: unwind (the running child is killed, temporary files removed).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.repeats < 5:
        print(f"bench: note: {args.repeats} repeats (the protocol asks for at least 5)", file=sys.stderr)
    if args.quick:
        args.workloads, args.threads, args.no_parts, args.no_testdev = "tiny", "1", True, True
    if args.testdev_only:
        args.configs, args.no_parts = "", True
    unknown = [t for t in args.testdev_settings.split(",") if t and t not in TESTDEV_SETTINGS]
    if unknown:
        print(f"bench: unknown --testdev-settings {','.join(unknown)}; known: {', '.join(TESTDEV_SETTINGS)}",
              file=sys.stderr)
        return 2
    unknown = [w for w in args.workloads.split(",") if w and (w not in WORKLOADS or w == "testdev")]
    if unknown:
        print(f"bench: unknown --workloads {','.join(unknown)}; known: "
              f"{', '.join(w for w in WORKLOADS if w != 'testdev')} (testdev: the device tables)", file=sys.stderr)
        return 2
    SUMMARY["testdev_sync_us"] = args.testdev_sync_us
    SUMMARY["testdev_launch_us"] = args.testdev_launch_us
    if not LIB.exists():
        print(f"bench: {LIB} is missing; run scripts/setup.sh", file=sys.stderr)
        return 2

    for spec in args.extra:
        name, _, rest = spec.partition("=")
        base, *pairs = rest.split(",")
        env = dict(p.split("=", 1) for p in pairs if "=" in p)
        if not name or name in DESCRIBE or base not in EXTRA_BASES or len(env) != len(pairs) or not env:
            print(f"bench: --extra {spec!r}: expected NAME=BASE,VAR=VALUE,... with a new NAME, BASE one of "
                  f"{', '.join(EXTRA_BASES)} and at least one VAR=VALUE", file=sys.stderr)
            return 2
        EXTRA[name] = (base, env)
        DESCRIBE[name] = DESCRIBE[base] + ", " + extra_vars(name)
    configs = [] if args.parts_only else [c for c in args.configs.split(",") if c]
    configs += [c for c in EXTRA if c not in configs and not args.parts_only]
    device_configs = [] if args.parts_only or args.no_testdev else [c for c in args.testdev_configs.split(",") if c]
    if not args.before_lib:
        device_configs = [c for c in device_configs if c != "on-before"]
        if any(base_of(c) in BEFORE for c in configs):
            print("bench: on-before, on-reference-before (or an --extra configuration based on one) need "
                  "--before-lib", file=sys.stderr)
            return 2
    py_for = {c: str(VENV_PY) for c in configs + device_configs}
    header_notes = []
    if "msprobe" in configs:
        ms_py, why = ensure_msprobe(not args.no_msprobe_install)
        if ms_py:
            py_for["msprobe"] = ms_py
            ver = subprocess.run([ms_py, "-c", "from importlib.metadata import version; "
                                  "print(version('mindstudio-probe'))"], capture_output=True, text=True)
            header_notes.append(f"msprobe: mindstudio-probe {ver.stdout.strip()} from {MSPROBE_VENV} "
                                f"(the project's torch via a .pth)")
        else:
            configs.remove("msprobe")
            header_notes.append(f"msprobe: not available ({why})")

    torch_ver = subprocess.run([str(VENV_PY), "-c", "import torch; print(torch.__version__)"],
                               capture_output=True, text=True).stdout.strip()
    core = LIB.with_name("libopdump_core.so")
    newest = max(p.stat().st_mtime for p in (LIB, core) if p.exists())
    lib_time = time.strftime("%Y-%m-%d %H:%M", time.localtime(newest))
    shown, skip = [], False
    for a in sys.argv[1:]:
        if skip or a.startswith("--out="):
            skip = False
            continue
        if a == "--out":
            skip = True
            continue
        shown.append(a)
    cmd = "scripts/bench/run.sh " + " ".join(shown)
    report = [
        f"## opdump benchmark, {time.strftime('%Y-%m-%d %H:%M')}",
        "",
        f"command: `{cmd.strip()}`; torch {torch_ver}; {os.cpu_count()} CPUs; "
        f"load average at start {os.getloadavg()[0]:.1f}; libopdump.so/libopdump_core.so built {lib_time}",
        "",
    ] + [f"- {n}" for n in header_notes] + [""]

    tmp = Path(tempfile.mkdtemp(prefix="opdump-bench-", dir="/tmp"))
    # Every process loads a private copy of the library taken now, so a
    # rebuild of target/ during the run (other work on this tree) cannot put
    # two builds into one table.
    libdir = tmp / "lib"
    libdir.mkdir()
    for p in (LIB, core):
        shutil.copy2(p, libdir / p.name)
    args.lib = str(libdir / LIB.name)
    args.before_lib_copy = None
    if args.before_lib:
        before = Path(args.before_lib).resolve()
        (tmp / "before").mkdir()
        for p in (before, before.with_name("libopdump_core.so")):
            shutil.copy2(p, tmp / "before" / p.name)
        args.before_lib_copy = str(tmp / "before" / before.name)
        built = max(p.stat().st_mtime for p in (before, before.with_name("libopdump_core.so")))
        report.insert(-1, f"- on-before: {before} and its libopdump_core.so (built "
                      f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(built))})")
    t_all = time.time()
    try:
        report[-1:-1] = prepare_bound(configs, args, tmp)
        for tsetting in [t for t in args.threads.split(",") if t and configs]:
            threads = 1 if tsetting == "1" else 0
            print(f"bench: threads={tsetting}", file=sys.stderr, flush=True)
            report += bench_threads(threads, [w for w in args.workloads.split(",") if w], configs, args,
                                    py_for, tmp)
        for setting in [t for t in args.testdev_settings.split(",") if t and device_configs]:
            what, env = TESTDEV_SETTINGS[setting]
            env = dict(env, TESTDEV_SYNC_US=f"{args.testdev_sync_us:g}",
                       TESTDEV_LAUNCH_US=f"{args.testdev_launch_us:g}")
            title = f"{what}, {args.testdev_sync_us:g} µs per host wait, {args.testdev_launch_us:g} µs per launch"
            print(f"bench: {title}", file=sys.stderr, flush=True)
            report += bench_threads(1, ["testdev"], device_configs, args, py_for, tmp,
                                    {"title": title, "env": env, "key": setting})
        if not args.no_parts:
            print("bench: writer throughput", file=sys.stderr, flush=True)
            report += writer_bench(args, tmp)
            print("bench: opdump compare", file=sys.stderr, flush=True)
            report += compare_bench(args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report += goal_table()
    report.append(f"total benchmark time: {time.time() - t_all:.0f} s; load average at end "
                  f"{os.getloadavg()[0]:.1f}")
    text = "\n".join(report)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
