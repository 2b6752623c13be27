"""A small transformer language model, the workload of the demo, the
cross-device tests and the benchmark: embedding, attention with softmax and a
causal mask, LayerNorm, a GELU MLP, cross-entropy and AdamW.

Parameters and data are made on the CPU from a seed, with no dropout, and only
then moved to the device, so every device starts from the same numbers."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x, mask):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        shape = (b, t, self.heads, d // self.heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyLM(nn.Module):
    def __init__(self, vocab=512, d=128, layers=2, heads=4, seq=32):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx):
        t = idx.shape[1]
        pos = torch.arange(t, device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        mask = torch.ones(t, t, dtype=torch.bool, device=idx.device).triu(1)
        for blk in self.blocks:
            x = blk(x, mask)
        return self.head(self.ln_f(x))


def make(seed=0, **kw):
    """The model, on the CPU, from a seed."""
    torch.manual_seed(seed)
    return TinyLM(**kw)


def batches(steps, batch=16, seq=32, vocab=512, seed=1):
    """Input and target tokens for each step, on the CPU, from a seed."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        data = torch.randint(0, vocab, (batch, seq + 1), generator=g)
        out.append((data[:, :-1], data[:, 1:]))
    return out


def train(device, steps=2, seed=0, dtype=None, autocast=None, compile=None, after=None, **kw):
    """Trains for `steps` AdamW steps on `device`; returns the losses.
    compile: a torch.compile backend ("inductor", "aot_eager") for the model.
    after: called with the trained model (a job's last look at its weights)."""
    model = make(seed, **kw)
    data = batches(steps, vocab=kw.get("vocab", 512), seq=kw.get("seq", 32))
    model = model.to(device=device, dtype=dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if compile:
        model = torch.compile(model, backend=compile)
    losses = []
    for x, y in data:
        x, y = x.to(device), y.to(device)
        opt.zero_grad()
        if autocast:
            with torch.autocast(device_type=torch.device(device).type, dtype=autocast):
                logits = model(x)
        else:
            logits = model(x)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        losses.append(float(loss))
    if after:
        after(model)
    return losses
