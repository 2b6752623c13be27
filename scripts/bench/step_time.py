"""A quick look, not the benchmark: median TinyLM training-step time in one
process, one intra-op thread. The side-by-side benchmark is run.py.

    .venv/bin/python scripts/bench/step_time.py                       # library not loaded
    LOAD=1 .venv/bin/python scripts/bench/step_time.py                # loaded, off
    LOAD=1 OPDUMP=1 OPDUMP_DIR=/tmp/d .venv/bin/python scripts/bench/step_time.py
"""

import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import torch  # noqa: E402

import tinylm  # noqa: E402

torch.set_num_threads(1)
if os.environ.get("LOAD"):
    torch.ops.load_library(str(ROOT / "target" / "release" / "libopdump.so"))
model = tinylm.make(0)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
times = []
for x, y in tinylm.batches(8):
    t0 = time.perf_counter()
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
    opt.step()
    times.append(time.perf_counter() - t0)
steady = sorted(times[2:])
print(f"median step {steady[len(steady) // 2] * 1000:.1f} ms")
