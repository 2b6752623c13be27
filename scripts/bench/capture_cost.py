"""What capturing a call costs (OPDUMP_CAPTURE): the demo's guilty call,
aten::gelu on a [16, 32, 512] float32 activation, timed with dumping on and
every call captured, against dumping on and none captured, side by side in
one process each, with the size of a capture file.

    .venv/bin/python scripts/bench/capture_cost.py [--calls 100] [--repeats 5]

Prints one JSON line: the median time per call (ms) in each configuration
over the repeats, their difference (the cost of one capture: copying the
input before the op and the output after it, and the file the writer thread
writes), and the bytes of one capture file.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "release"

CHILD = """
import json, os, sys, time, torch
torch.ops.load_library(os.environ["LIB"])
torch.set_num_threads(1)
x = torch.randn(16, 32, 512)
calls = int(os.environ["CALLS"])
torch.ops.opdump.enable()
for _ in range(3):
    torch.nn.functional.gelu(x)
t0 = time.perf_counter()
for _ in range(calls):
    torch.nn.functional.gelu(x)
torch.ops.opdump.flush()
print(json.dumps((time.perf_counter() - t0) / calls * 1e3))
"""


def one(captured: bool, calls: int, tmp: Path) -> tuple[float, int]:
    d = Path(tempfile.mkdtemp(dir=tmp))
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPDUMP")}
    env.update(LIB=str(TARGET / "libopdump.so"), OPDUMP_DIR=str(d), CALLS=str(calls))
    if captured:
        # Every timed call (the three warm-up calls come first).
        env["OPDUMP_CAPTURE"] = ";".join(f"aten::gelu#{i}" for i in range(3, 3 + calls))
    p = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True)
    files = list(d.glob("rank=*/device=*/capture-*.safetensors"))
    if captured and len(files) != calls:
        sys.exit(f"capture_cost: {len(files)} capture files, {calls} expected:\n{p.stderr}")
    return float(p.stdout.strip().splitlines()[-1]), files[0].stat().st_size if files else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    on, captured, size = [], [], 0
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):  # interleaved
            on.append(one(False, args.calls, Path(tmp))[0])
            ms, size = one(True, args.calls, Path(tmp))
            captured.append(ms)
    m_on, m_cap = statistics.median(on), statistics.median(captured)
    print(json.dumps({"call": "aten::gelu [16, 32, 512] float32", "ms_per_call_on": round(m_on, 3),
                      "ms_per_call_captured": round(m_cap, 3), "ms_per_capture": round(m_cap - m_on, 3),
                      "capture_file_bytes": size, "calls": args.calls, "repeats": args.repeats,
                      "on_range": [round(min(on), 3), round(max(on), 3)],
                      "captured_range": [round(min(captured), 3), round(max(captured), 3)]}))


if __name__ == "__main__":
    main()
