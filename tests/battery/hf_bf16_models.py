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
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    return hf_models.train(family, device, steps, seed, dtype=dtype)
