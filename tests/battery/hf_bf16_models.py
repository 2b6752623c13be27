"""The Hugging Face decoders of hf_models.py in mixed dtypes: float32 on
the CPU (the reference) against bfloat16 on any other device, after
`model.to(torch.bfloat16)`. Not a test dependency (needs `transformers`):

    .venv/bin/python tests/battery/run.py --models tests.battery.hf_bf16_models"""

import torch

from tests.battery import hf_models

FAMILIES = ["llama", "qwen2"]


def train(family, device, steps=2, seed=0):
    """`steps` AdamW steps of `family` on `device`, in float32 on the CPU and
    in bfloat16 elsewhere; returns the losses."""
    torch.manual_seed(seed)
    model = hf_models._families()[family]()
    hf_models._no_dropout(model)
    model.train()
    g = torch.Generator().manual_seed(seed + 1)
    batches = [hf_models._batch(family, g) for _ in range(steps)]
    model = model.to(device=device, dtype=torch.float32 if device == "cpu" else torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for b in batches:
        loss = model(**{k: v.to(device) for k, v in b.items()}).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.float().item()))
    return losses
