"""A small MLP under FSDP2 (`fully_shard`) on CPU processes with gloo, three
AdamW steps; run with torchrun. FAULT_RANK=R scales aten::addmm's CPU kernel
by 1.01 on rank R alone, to emulate one rank whose kernel is wrong. Prints
each rank's losses and the full parameters' sums as one JSON line."""

import json
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard


def plant_fault(rank):
    if os.environ.get("FAULT_RANK") != str(rank):
        return None
    lib = torch.library.Library("aten", "IMPL")

    def addmm(bias, a, b, beta=1, alpha=1):
        return (bias * beta + torch.mm(a, b) * alpha) * 1.01

    lib.impl("addmm", addmm, "CPU")
    return lib


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if os.environ.get("TESTJOB_LIB"):
        torch.ops.load_library(os.environ["TESTJOB_LIB"])
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    for m in model:
        if isinstance(m, nn.Linear):
            fully_shard(m)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    torch.manual_seed(1 + rank)
    x = torch.randn(8, 16)
    fault = plant_fault(rank)  # noqa: F841 (kept alive for the run)
    losses = []
    for _ in range(3):
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    full = [p.full_tensor().sum().item() for p in model.parameters()]
    print(json.dumps({"rank": rank, "losses": losses, "params": full}), flush=True)
    dist.destroy_process_group()


main()
