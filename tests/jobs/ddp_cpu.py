"""A data-parallel training job on the CPU: WORLD processes (gloo, started
with torch.multiprocessing, forked), a small MLP with a BatchNorm in
DistributedDataParallel, SGD, STEPS steps, each rank on its own data.

Run as `python ddp_cpu.py LIB INIT_FILE`, with OPDUMP_DIR set: each worker
loads opdump from LIB and switches it on once the process group exists, so
that opdump takes the worker's rank from torch.distributed.

FLIP="<rank>:<step>" makes that rank flip the lowest bit of the first
element of one parameter's gradient at that step, after backward (so after
DDP's all-reduce) and before the optimizer: the update of that rank, and its
parameter from then on, differ from every other rank's.

Buffers are not broadcast (broadcast_buffers=False): BatchNorm's running
statistics differ per rank, as they legitimately may.

Prints, on its last line, the JSON {"flipped": <parameter name or null>}."""

import json
import os
import sys
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

WORLD = int(os.environ.get("WORLD", "4"))
STEPS = int(os.environ.get("STEPS", "3"))
# The parameter whose gradient FLIP changes, by its name in the DDP model.
FLIPPED = "module.3.weight"


def flip_spec():
    spec = os.environ.get("FLIP")
    if not spec:
        return None
    rank, step = spec.split(":")
    return int(rank), int(step)


def worker(rank, lib, init):
    torch.ops.load_library(lib)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD)
    torch.ops.opdump.enable()
    torch.manual_seed(0)  # the same initial weights everywhere (DDP broadcasts them anyway)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(),
                          nn.Linear(16, 4))
    with warnings.catch_warnings():  # newer torch renames the option; its meaning is what is wanted
        warnings.simplefilter("ignore", FutureWarning)
        ddp = nn.parallel.DistributedDataParallel(model, broadcast_buffers=False)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    params = dict(ddp.named_parameters())
    flip = flip_spec()
    data = torch.Generator().manual_seed(100 + rank)  # each rank its own batch
    for step in range(STEPS):
        x = torch.randn(32, 8, generator=data)
        y = torch.randn(32, 4, generator=data)
        opt.zero_grad()
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        if flip == (rank, step):
            with torch.no_grad():
                params[FLIPPED].grad.view(torch.int32).view(-1)[0] ^= 1
        opt.step()
    torch.ops.opdump.flush()
    dist.destroy_process_group()


if __name__ == "__main__":
    lib, init = sys.argv[1:3]
    # Forked workers inherit the imported torch instead of importing it
    # again each (the parent has run no op, so no thread pool is copied).
    mp.start_processes(worker, args=(lib, init), nprocs=WORLD, start_method="fork")
    print(json.dumps({"flipped": FLIPPED if flip_spec() else None}))
