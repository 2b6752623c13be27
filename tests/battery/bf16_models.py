"""The battery's Llama in mixed precision: float32 on the CPU (the
reference) against bfloat16 on any other device, after
`model.to(torch.bfloat16)`, for tests/test_battery.py:

    .venv/bin/python tests/battery/run.py llama --models tests.battery.bf16_models

The model is models.Llama with its rotary tables cast to the model's dtype
(as Hugging Face's Llama does): in float32 they would promote q and k to
float32 while v stays bfloat16."""

import torch

from tests.battery import models


class Llama(models.Llama):
    def forward(self, ids):
        t = ids.shape[1]
        dh = self.embed.embedding_dim // self.heads
        dtype = self.embed.weight.dtype
        inv = 1.0 / (10000 ** (torch.arange(0, dh, 2, device=ids.device).float() / dh))
        freqs = torch.outer(torch.arange(t, device=ids.device).float(), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))


FAMILIES = {"llama": (Llama, models.llama_data, models.lm_loss)}


def dtype_of(device):
    return torch.float32 if device == "cpu" else torch.bfloat16


def train(family, device, steps=2, seed=0):
    """`steps` AdamW steps of `family` on `device`, in float32 on the CPU and
    in bfloat16 elsewhere; returns the losses (as float32 numbers)."""
    make, data, loss_fn = FAMILIES[family]
    torch.manual_seed(seed)
    model = models.hf_init(make())
    g = torch.Generator().manual_seed(seed + 1)
    batches = [data(g) for _ in range(steps)]
    model = model.to(device=device, dtype=dtype_of(device))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for inputs, labels in batches:
        inputs = tuple(t.to(device) for t in inputs)
        loss = loss_fn(model, inputs, labels.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.item()))
    return losses

