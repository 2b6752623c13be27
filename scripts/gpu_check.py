"""The device checks of opdump on a real accelerator, in one run that needs
torch and the Python standard library only (no cargo, no pyarrow): the
library and the CLI are the ones scripts/test-torch211.sh builds.

    scripts/gpu-check.sh                         # on a machine with an NVIDIA GPU
    scripts/gpu-check.sh --device testdev        # a dry run of the same script on the CPU-only test device
    scripts/gpu-check.sh --out results.json

Each check runs in its own process:
  1. speed: the TinyLM training step on the device with opdump loaded and
     off, then on; the median step time and torch.cuda.max_memory_allocated
     of each, and their ratios, several repeats interleaved;
  2. compare: the same two steps dumped on cpu and on the device, then
     `opdump compare`: a fault-free pair must show no introduced divergence
     (exit 0, or 3: drift that no op introduced);
  3. capture: a small model captured in a CUDA graph (torch.cuda.graph) with
     opdump on, replayed; the capture must succeed, the replay give the eager
     result, and the captured calls be recorded with the status `capturing`;
  4. launches: kernel launches per measured tensor over one TinyLM training
     step: after a warm-up step, one step under torch.profiler with opdump
     off (loaded, not dumping), one with opdump on and its flush (so that the
     last batch's close is counted), one off again; (kernels on - kernels
     off) / tensors measured (torch.ops.opdump.device_stats()[0] over the
     'on' step), with the statistics alone and with OPDUMP_SKETCH=16, one
     process each. The device's kernels are counted from the profiler's CUDA
     events, the host's cudaLaunchKernel-like calls as a cross-check, copies
     and fills apart. On testdev the profiler sees no kernels, and
     testdev.launches()["observer"] is the count (the JSON names the counter
     used). It passes when it ran and measured tensors: the figure is
     recorded, not judged.
Everything measured goes to one JSON file; a summary goes to stdout. The exit
status is 0 when every check passed."""

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target-torch211")) / "release"


# ---- workers: each runs in a process of its own --------------------------------

def load_device(device):
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "scripts"))
    import torch

    if device.startswith("testdev"):
        import tests.testdev as testdev

        testdev.load()
    return torch


def synchronize(torch, device):
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def max_memory(torch, device):
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated()
    import tests.testdev as testdev

    return testdev.max_memory_allocated()


def reset_peak(torch, device):
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    else:
        import tests.testdev as testdev

        testdev.reset_peak_memory_stats()


def worker_speed(device, steps, on):
    torch = load_device(device)
    torch.ops.load_library(os.environ["GPU_CHECK_LIB"])
    import torch.nn.functional as F

    import tinylm

    model = tinylm.make(0).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = [(x.to(device), y.to(device)) for x, y in tinylm.batches(steps + 2)]

    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()

    if on:
        torch.ops.opdump.enable()
    for x, y in data[:2]:  # warm-up
        step(x, y)
    torch.ops.opdump.flush()
    synchronize(torch, device)
    reset_peak(torch, device)
    times = []
    for x, y in data[2:]:
        t0 = time.perf_counter()
        step(x, y)
        synchronize(torch, device)
        times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    torch.ops.opdump.flush()
    flush = time.perf_counter() - t0
    print(json.dumps({"step_s": statistics.median(times), "flush_s": flush,
                      "max_memory_allocated": max_memory(torch, device),
                      "records": torch.ops.opdump.stats(), "device_stats": torch.ops.opdump.device_stats()}))


def worker_train(device, steps):
    torch = load_device(device)
    import tinylm

    losses = tinylm.train(device, steps=steps)
    print(json.dumps({"losses": losses, "device_stats": torch.ops.opdump.device_stats()}))


def worker_capture(device):
    torch = load_device(device)
    torch.ops.load_library(os.environ["GPU_CHECK_LIB"])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 64)).to(device)
    x = torch.randn(32, 256, device=device)
    torch.ops.opdump.enable()
    with torch.no_grad():
        eager = model(x).clone()
        torch.ops.opdump.step()  # step 1: the captured calls
        if device.startswith("cuda"):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up on a side stream, as CUDA graphs want
                for _ in range(3):
                    model(x)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_out = model(x)
            torch.ops.opdump.step()  # step 2: after the capture
            graph.replay()
            torch.cuda.synchronize()
            replayed = static_out.clone()
        else:
            import tests.testdev as testdev

            with testdev.capture():
                static_out = model(x)
            torch.ops.opdump.step()
            replayed = static_out.clone()
    torch.ops.opdump.flush()
    print(json.dumps({"max_abs_diff": float((replayed - eager).abs().max()),
                      "device_stats": torch.ops.opdump.device_stats()}))


# The CUDA runtime and driver calls the profiler records on the host: a launch
# (cudaLaunchKernel, cudaLaunchKernelExC, cuLaunchKernel, cuLaunchKernelEx, the
# cooperative forms), a copy, a fill, a host wait.
LAUNCH_API = re.compile(r"^cu(da)?Launch(Cooperative)?Kernel")
MEMCPY_API = re.compile(r"^cu(da)?Memcpy")
MEMSET_API = re.compile(r"^cu(da)?Memset")
SYNC_API = re.compile(r"^cu(da)?(Device|Stream|Event|Ctx)Synchronize")
COUNTS = ("kernels", "launch_api", "memcpy", "memset", "memcpy_api", "memset_api", "sync_api")


def profiled_counts(torch, prof):
    """What one profiled step launched, from the profiler's events: the
    device's kernels, copies and fills (told apart by kineto's names, which
    torch 2.x has kept: "Memcpy HtoD (...)", "Memset (Device)"), and the
    host's runtime calls that launch, copy, fill and wait, as a cross-check
    on the device's side. Returns the counts and the kernels by name.

    Reads kineto's raw events: prof.events() builds the tree of every op
    first, minutes for a step with the sketch on a loaded CPU."""
    c, kernels = Counter(), Counter()
    results = getattr(prof.profiler, "kineto_results", None)
    if results is not None:
        events = ((e.name(), e.device_type(), getattr(e, "is_user_annotation", lambda: False)())
                  for e in results.events())
    else:
        events = ((e.name, e.device_type, getattr(e, "is_user_annotation", False)) for e in prof.events())
    for name, device_type, annotation in events:
        if device_type == torch.autograd.DeviceType.CUDA:
            if annotation:  # a record_function's span on the device
                continue
            if name.startswith("Memcpy"):
                c["memcpy"] += 1
            elif name.startswith("Memset"):
                c["memset"] += 1
            else:
                c["kernels"] += 1
                kernels[name] += 1
        elif LAUNCH_API.match(name):
            c["launch_api"] += 1
        elif MEMCPY_API.match(name):
            c["memcpy_api"] += 1
        elif MEMSET_API.match(name):
            c["memset_api"] += 1
        elif SYNC_API.match(name):
            c["sync_api"] += 1
    return {k: c[k] for k in COUNTS}, kernels


def worker_launches(device):
    """One TinyLM step profiled with opdump off, one with opdump on (and its
    flush, so that the last batch's close is in the window), one off again
    to show the count is steady. OPDUMP_SKETCH comes from the parent."""
    torch = load_device(device)
    torch.ops.load_library(os.environ["GPU_CHECK_LIB"])
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile

    import tinylm

    testdev = None
    if device.startswith("testdev"):
        import tests.testdev as testdev

        testdev.set_job_thread()
    model = tinylm.make(0).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = [(x.to(device), y.to(device)) for x, y in tinylm.batches(4)]

    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()

    # Only the activities this torch can record: on a machine without CUPTI
    # (the testdev dry run) CUDA is not among them.
    wanted = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
    activities = [a for a in wanted if a in torch.profiler.supported_activities()]
    steps, names = {}, {}
    for i, cfg in enumerate(("warmup", "off", "on", "off_again")):
        x, y = data[i]
        # The warm-up dumps too: no first-use work (AdamW's state, opdump's setup) in the counts.
        on = cfg in ("warmup", "on")
        synchronize(torch, device)
        if testdev:
            testdev.reset_counters()
        before = torch.ops.opdump.device_stats()
        with profile(activities=activities) as prof:
            if on:
                torch.ops.opdump.enable()
            step(x, y)
            if on:
                torch.ops.opdump.flush()  # closes the last batch inside the window
                torch.ops.opdump.disable()
            synchronize(torch, device)
        after = torch.ops.opdump.device_stats()
        counts, names[cfg] = profiled_counts(torch, prof)
        counts["measured"] = after[0] - before[0]
        counts["device_stats"] = after
        if testdev:
            counts["testdev_launches"] = testdev.launches()
        steps[cfg] = counts
    if testdev:
        # The profiler sees no kernels of a PrivateUse1 device: testdev
        # counts the launches opdump's measurements make (its observer).
        counter = 'testdev.launches()["observer"]'
        for c in steps.values():
            c["launches"] = c["testdev_launches"]["observer"]
    else:
        counter = "profiler: device events of type CUDA that are kernels"
        for c in steps.values():
            c["launches"] = c["kernels"]
    added = names["on"] - names["off"]
    print(json.dumps({"counter": counter, "activities": [str(a) for a in activities], "steps": steps,
                      "kernels_added": dict(added.most_common(40)),
                      "records": torch.ops.opdump.stats()}))


# ---- the parent --------------------------------------------------------------------

def run_worker(args, env_extra, timeout=300):
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPDUMP")}
    env.update(env_extra)
    env["PYTHONUNBUFFERED"] = "1"
    t0 = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, __file__, *args], env=env, capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired as e:  # one stuck worker fails its check, not the whole run
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr or ""
        return {"returncode": None, "timed_out_s": timeout, "wall_s": round(time.perf_counter() - t0, 2),
                "opdump_lines": [l for l in err.splitlines() if l.startswith("opdump:")],
                "stderr_tail": err[-3000:]}
    out = {"returncode": p.returncode, "wall_s": round(time.perf_counter() - t0, 2),
           "opdump_lines": [l for l in p.stderr.splitlines() if l.startswith("opdump:")]}
    if p.returncode == 0 and p.stdout.strip():
        out.update(json.loads(p.stdout.strip().splitlines()[-1]))
    else:
        out["stderr_tail"] = p.stderr[-3000:]
    return out


def check_speed(device, lib, repeats, steps):
    runs = {"off": [], "on": []}
    for r in range(repeats):
        order = ["off", "on"] if r % 2 == 0 else ["on", "off"]
        for cfg in order:
            with tempfile.TemporaryDirectory(prefix="opdump-gpu-check-") as d:
                runs[cfg].append(run_worker(["--worker", "speed", "--device", device, "--steps", str(steps)]
                                            + (["--on"] if cfg == "on" else []),
                                            {"GPU_CHECK_LIB": str(lib), "OPDUMP_DIR": d}))
    ok = all(r["returncode"] == 0 for v in runs.values() for r in v)
    res = {"ok": ok, "repeats": repeats, "timed_steps": steps, "runs": runs}
    if ok:
        med = {c: statistics.median(r["step_s"] for r in v) for c, v in runs.items()}
        mem = {c: max(r["max_memory_allocated"] for r in v) for c, v in runs.items()}
        res.update(step_s=med, ratio_on_off=med["on"] / med["off"], max_memory_allocated=mem,
                   extra_memory_bytes=mem["on"] - mem["off"])
    return res


def check_compare(device, lib, cli, steps, out_dir):
    dumps = {}
    runs = {}
    for dev in ("cpu", device):
        dump = out_dir / dev.replace(":", "_")
        shutil.rmtree(dump, ignore_errors=True)
        runs[dev] = run_worker(["--worker", "train", "--device", dev, "--steps", str(steps)],
                               {"OPDUMP": "1", "OPDUMP_DIR": str(dump), "LD_PRELOAD": str(lib)})
        dumps[dev] = dump
    res = {"runs": runs}
    if any(r["returncode"] != 0 for r in runs.values()):
        res["ok"] = False
        return res
    p = subprocess.run([str(cli), "compare", str(dumps["cpu"]), str(dumps[device]), "--json"],
                       capture_output=True, text=True, timeout=300)
    res["compare_exit"] = p.returncode
    try:
        report = json.loads(p.stdout)
        res["headline"] = report.get("headline")
        res["first_introduced"] = report.get("first_introduced")
        res["first_divergence"] = report.get("first_divergence")
    except json.JSONDecodeError:
        res["compare_stderr"] = p.stderr[-3000:]
    text = subprocess.run([str(cli), "compare", str(dumps["cpu"]), str(dumps[device])],
                          capture_output=True, text=True, timeout=300)
    res["compare_report"] = text.stdout[-6000:]
    res["ok"] = p.returncode in (0, 3)
    return res


def check_capture(device, lib):
    with tempfile.TemporaryDirectory(prefix="opdump-gpu-check-") as d:
        r = run_worker(["--worker", "capture", "--device", device], {"GPU_CHECK_LIB": str(lib), "OPDUMP_DIR": d})
    r["ok"] = r["returncode"] == 0 and r.get("max_abs_diff", 1) == 0 and r["device_stats"][2] > 0 \
        and not r["opdump_lines"]
    return r


def check_launches(device, lib):
    """Kernel launches per measured tensor, with the statistics alone and with
    the fingerprint and sketch. Passes on sanity only (the worker ran and
    measured something, and on CUDA the profiler saw the step's kernels):
    the figure is recorded, not judged."""
    res = {"ok": True}
    for name, sketch in (("statistics", "0"), ("sketch16", "16")):
        with tempfile.TemporaryDirectory(prefix="opdump-gpu-check-") as d:
            r = run_worker(["--worker", "launches", "--device", device],
                           {"GPU_CHECK_LIB": str(lib), "OPDUMP_DIR": d, "OPDUMP_SKETCH": sketch}, timeout=180)
        r["OPDUMP_SKETCH"] = sketch
        if r["returncode"] == 0:
            on, off = r["steps"]["on"], r["steps"]["off"]
            measured = on["measured"]
            r["measured"] = measured
            why = [w for w, bad in (("nothing measured in the 'on' step", measured <= 0),
                                    ("tensors measured in the 'off' step", off["measured"] != 0),
                                    ("the profiler saw no CUDA kernel in the 'off' step (no CUPTI?)",
                                     not device.startswith("testdev") and off["kernels"] == 0)) if bad]
            r["ok"] = not why
            if why:
                r["why"] = why
            if measured > 0:
                r["launches_per_measured"] = (on["launches"] - off["launches"]) / measured
                r["launch_api_per_measured"] = (on["launch_api"] - off["launch_api"]) / measured
                r["copies_per_measured"] = (on["memcpy"] + on["memset"] - off["memcpy"] - off["memset"]) / measured
        else:
            r["ok"] = False
        res[name] = r
        res["ok"] = res["ok"] and r["ok"]
    return res


def launches_line(name, r):
    if not r.get("ok") and "launches_per_measured" not in r:
        why = f"timed out after {r['timed_out_s']} s" if "timed_out_s" in r else \
            "; ".join(r.get("why", [])) or f"exit {r.get('returncode')}, stderr in the JSON"
        return f"launches ({name}): FAILED ({why})"
    on, off = r["steps"]["on"], r["steps"]["off"]
    return (f"launches ({name}): {r['launches_per_measured']:.2f} per measured tensor, {r['measured']} measured; "
            f"launches {off['launches']} off -> {on['launches']} on by {r['counter']}; "
            f"launch calls {off['launch_api']} -> {on['launch_api']}, memcpy {off['memcpy']} -> {on['memcpy']}, "
            f"memset {off['memset']} -> {on['memset']}{'' if r['ok'] else ' FAILED: ' + '; '.join(r['why'])}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default=None, help="the results file (default: $OUT/gpu-check.json or ./gpu-check.json)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10, help="timed steps per speed run")
    ap.add_argument("--lib", default=str(TARGET / "libopdump.so"))
    ap.add_argument("--cli", default=str(TARGET / "opdump"))
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--on", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker == "speed":
        return worker_speed(args.device, args.steps, args.on)
    if args.worker == "train":
        return worker_train(args.device, args.steps)
    if args.worker == "capture":
        return worker_capture(args.device)
    if args.worker == "launches":
        return worker_launches(args.device)

    lib, cli = Path(args.lib), Path(args.cli)
    for p in (lib, cli):
        if not p.exists():
            sys.exit(f"gpu-check: {p} is missing; build it with scripts/test-torch211.sh (or pass --lib/--cli)")
    out = Path(args.out or Path(os.environ.get("OUT", ".")) / "gpu-check.json")
    import torch

    t0 = time.perf_counter()
    results = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "device": args.device, "torch": torch.__version__,
               "python": platform.python_version(), "lib": str(lib)}
    if args.device.startswith("cuda"):
        if not torch.cuda.is_available():
            sys.exit("gpu-check: torch sees no CUDA device (use --device testdev for a dry run)")
        results["gpu"] = torch.cuda.get_device_name()
    with tempfile.TemporaryDirectory(prefix="opdump-gpu-check-") as d:
        print("gpu-check: speed (TinyLM step, opdump off and on)", flush=True)
        results["speed"] = check_speed(args.device, lib, args.repeats, args.steps)
        print("gpu-check: cpu against", args.device, "with opdump compare", flush=True)
        results["compare"] = check_compare(args.device, lib, cli, 2, Path(d))
        print("gpu-check: a graph capture under opdump", flush=True)
        results["capture"] = check_capture(args.device, lib)
        print("gpu-check: kernel launches per measured tensor (profiled TinyLM step)", flush=True)
        results["launches"] = check_launches(args.device, lib)
    results["wall_s"] = round(time.perf_counter() - t0, 1)
    results["ok"] = all(results[k]["ok"] for k in ("speed", "compare", "capture", "launches"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    s, c, g, n = results["speed"], results["compare"], results["capture"], results["launches"]
    if s["ok"]:
        print(f"speed: {s['step_s']['off'] * 1e3:.1f} ms off, {s['step_s']['on'] * 1e3:.1f} ms on "
              f"({s['ratio_on_off']:.2f}x); max memory allocated {s['max_memory_allocated']['off'] / 2**20:.1f} "
              f"-> {s['max_memory_allocated']['on'] / 2**20:.1f} MiB")
    print(f"compare: exit {c.get('compare_exit')}, headline {json.dumps(c.get('headline'))}")
    print(f"capture: {'ok' if g['ok'] else 'FAILED'}, device_stats {g.get('device_stats')}")
    for name in ("statistics", "sketch16"):
        print(launches_line(name, n[name]))
    print(f"gpu-check: {'passed' if results['ok'] else 'FAILED'} in {results['wall_s']} s; results in {out}")
    return 0 if results["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
