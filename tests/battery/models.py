"""Six small model families written in the style of real ones, for the
cross-device battery (tests/test_battery.py).

Each family reproduces the parts of its real counterpart that made two
correct devices look different in the past:

- `bert`: biased attention (the key bias's gradient is zero in exact
  arithmetic, so its `sum_to` is pure cancellation), fused SDPA, learned
  positions, token types, a tied MLM head;
- `t5`: an encoder-decoder with cross-attention, a relative position bias,
  RMSNorm (T5's LayerNorm without mean) and `torch.where` masks;
- `llama`: RMSNorm, rotary embeddings, SwiGLU, causal SDPA, untied head;
- `resnet`: conv + BatchNorm + ReLU residual blocks, max and adaptive pooling;
- `convnext`: depthwise 7x7 conv, channels-last LayerNorm, GELU MLP, layer
  scale;
- `wav2vec`: a conv1d audio front-end with GroupNorm and GELU, feature
  projection and a transformer encoder layer.

Parameters and inputs are made on the CPU from a seed and then moved, so both
devices start from the same numbers. `train(family, device, steps)` runs
AdamW steps and returns the losses; `autocast="bfloat16"` runs them in mixed
precision."""

import contextlib
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

# --- shared parts --------------------------------------------------------


class SelfAttention(nn.Module):
    """BERT/ViT-style attention: biased q, k, v projections, fused SDPA."""

    def __init__(self, d, heads, bias=True):
        super().__init__()
        self.heads = heads
        self.query = nn.Linear(d, d, bias=bias)
        self.key = nn.Linear(d, d, bias=bias)
        self.value = nn.Linear(d, d, bias=bias)
        self.out = nn.Linear(d, d, bias=bias)

    def split(self, x):
        b, t, d = x.shape
        return x.view(b, t, self.heads, d // self.heads).transpose(1, 2)

    def forward(self, x, kv=None, mask=None, causal=False):
        kv = x if kv is None else kv
        q, k, v = self.split(self.query(x)), self.split(self.key(kv)), self.split(self.value(kv))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal)
        b, h, t, dh = y.shape
        return self.out(y.transpose(1, 2).reshape(b, t, h * dh))


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))
        self.eps = eps

    def forward(self, x):
        var = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(var + self.eps))


# --- bert ------------------------------------------------------------------


class BertLayer(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.attention = SelfAttention(d, heads)
        self.ln1 = nn.LayerNorm(d, eps=1e-12)
        self.intermediate = nn.Linear(d, 4 * d)
        self.output = nn.Linear(4 * d, d)
        self.ln2 = nn.LayerNorm(d, eps=1e-12)

    def forward(self, x, mask):
        x = self.ln1(x + self.attention(x, mask=mask))
        return self.ln2(x + self.output(F.gelu(self.intermediate(x))))


class Bert(nn.Module):
    def __init__(self, vocab=300, d=64, heads=4, layers=2, seq=32):
        super().__init__()
        self.word = nn.Embedding(vocab, d)
        self.position = nn.Embedding(seq, d)
        self.token_type = nn.Embedding(2, d)
        self.ln = nn.LayerNorm(d, eps=1e-12)
        self.layers = nn.ModuleList(BertLayer(d, heads) for _ in range(layers))
        self.transform = nn.Linear(d, d)
        self.transform_ln = nn.LayerNorm(d, eps=1e-12)
        self.decoder = nn.Linear(d, vocab)
        self.decoder.weight = self.word.weight  # tied, as in BertForMaskedLM

    def forward(self, ids, types, pad):
        t = ids.shape[1]
        pos = torch.arange(t, device=ids.device)
        x = self.ln(self.word(ids) + self.position(pos) + self.token_type(types))
        # HF's extended attention mask: 0 where attended, a large negative
        # number on padding, added to the scores.
        mask = (1.0 - (~pad).to(x.dtype))[:, None, None, :] * torch.finfo(x.dtype).min
        for layer in self.layers:
            x = layer(x, mask)
        return self.decoder(self.transform_ln(F.gelu(self.transform(x))))


def bert_data(g, batch=4, seq=32, vocab=300):
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    types = (torch.arange(seq) >= seq // 2).long().expand(batch, seq).contiguous()
    pad = torch.zeros(batch, seq, dtype=torch.bool)
    pad[1, seq - 5:] = True
    labels = torch.randint(0, vocab, (batch, seq), generator=g)
    return (ids, types, pad), labels


def bert_loss(model, inputs, labels):
    logits = model(*inputs)
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


# --- t5 --------------------------------------------------------------------


class RelativeBias(nn.Module):
    """T5's bucketed relative position bias, one scalar per head."""

    def __init__(self, heads, buckets=16, bidirectional=True):
        super().__init__()
        self.buckets = buckets
        self.bidirectional = bidirectional
        self.bias = nn.Embedding(buckets, heads)

    def forward(self, q_len, k_len, device):
        rel = torch.arange(k_len, device=device)[None, :] - torch.arange(q_len, device=device)[:, None]
        n = self.buckets
        if self.bidirectional:
            n //= 2
            bucket = (rel > 0).long() * n
            rel = rel.abs()
        else:
            bucket = torch.zeros_like(rel)
            rel = -torch.clamp(rel, max=0)
        exact = n // 2
        large = exact + (torch.log(rel.float() / exact + 1e-6) / math.log(32 / exact) * (n - exact)).long()
        large = torch.min(large, torch.full_like(large, n - 1))
        bucket = bucket + torch.where(rel < exact, rel, large)
        return self.bias(bucket).permute(2, 0, 1).unsqueeze(0)


class T5Attention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(d, d, bias=False)
        self.k = nn.Linear(d, d, bias=False)
        self.v = nn.Linear(d, d, bias=False)
        self.o = nn.Linear(d, d, bias=False)

    def forward(self, x, kv, bias):
        b, t, d = x.shape
        h = self.heads
        q = self.q(x).view(b, t, h, -1).transpose(1, 2)
        k = self.k(kv).view(b, kv.shape[1], h, -1).transpose(1, 2)
        v = self.v(kv).view(b, kv.shape[1], h, -1).transpose(1, 2)
        scores = q @ k.transpose(-1, -2) + bias  # T5 does not scale by 1/sqrt(d)
        return self.o((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d))


class T5(nn.Module):
    def __init__(self, vocab=300, d=64, heads=4, layers=2):
        super().__init__()
        self.shared = nn.Embedding(vocab, d)
        self.enc_bias = RelativeBias(heads)
        self.dec_bias = RelativeBias(heads, bidirectional=False)
        self.enc = nn.ModuleList(nn.ModuleDict(dict(
            ln1=RMSNorm(d), att=T5Attention(d, heads), ln2=RMSNorm(d),
            wi=nn.Linear(d, 2 * d, bias=False), wo=nn.Linear(2 * d, d, bias=False))) for _ in range(layers))
        self.dec = nn.ModuleList(nn.ModuleDict(dict(
            ln1=RMSNorm(d), att=T5Attention(d, heads), ln2=RMSNorm(d), cross=T5Attention(d, heads),
            ln3=RMSNorm(d), wi=nn.Linear(d, 2 * d, bias=False), wo=nn.Linear(2 * d, d, bias=False)))
            for _ in range(layers))
        self.enc_ln = RMSNorm(d)
        self.dec_ln = RMSNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, src, tgt):
        dev = src.device
        x = self.shared(src)
        bias = self.enc_bias(src.shape[1], src.shape[1], dev)
        for m in self.enc:
            x = x + m["att"](m["ln1"](x), m["ln1"](x), bias)
            x = x + m["wo"](F.relu(m["wi"](m["ln2"](x))))
        mem = self.enc_ln(x)
        t = tgt.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool, device=dev).tril()
        dbias = torch.where(causal, self.dec_bias(t, t, dev), torch.finfo(mem.dtype).min)
        y = self.shared(tgt)
        for m in self.dec:
            y = y + m["att"](m["ln1"](y), m["ln1"](y), dbias)
            y = y + m["cross"](m["ln2"](y), mem, 0.0)
            y = y + m["wo"](F.relu(m["wi"](m["ln3"](y))))
        return self.lm_head(self.dec_ln(y) * (y.shape[-1] ** -0.5))


def t5_data(g, batch=4, src=24, tgt=16, vocab=300):
    s = torch.randint(0, vocab, (batch, src), generator=g)
    t = torch.randint(0, vocab, (batch, tgt + 1), generator=g)
    return (s, t[:, :-1]), t[:, 1:]


def t5_loss(model, inputs, labels):
    logits = model(*inputs)
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


# --- llama -----------------------------------------------------------------


def rope(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class LlamaLayer(nn.Module):
    def __init__(self, d, heads, hidden):
        super().__init__()
        self.heads = heads
        self.input_norm = RMSNorm(d)
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)
        self.post_norm = RMSNorm(d)
        self.gate_proj = nn.Linear(d, hidden, bias=False)
        self.up_proj = nn.Linear(d, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d, bias=False)

    def forward(self, x, cos, sin):
        b, t, d = x.shape
        h = self.input_norm(x)
        q, k, v = (p(h).view(b, t, self.heads, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o_proj(y.transpose(1, 2).reshape(b, t, d))
        h = self.post_norm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    def __init__(self, vocab=300, d=64, heads=4, layers=2, hidden=172):
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(LlamaLayer(d, heads, hidden) for _ in range(layers))
        self.norm = RMSNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        t = ids.shape[1]
        dh = self.embed.embedding_dim // self.heads
        inv = 1.0 / (10000 ** (torch.arange(0, dh, 2, device=ids.device).float() / dh))
        freqs = torch.outer(torch.arange(t, device=ids.device).float(), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))


def llama_data(g, batch=4, seq=32, vocab=300):
    d = torch.randint(0, vocab, (batch, seq + 1), generator=g)
    return (d[:, :-1],), d[:, 1:]


# --- resnet ----------------------------------------------------------------


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


class ResNet(nn.Module):
    def __init__(self, classes=10, width=16):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        self.pool = nn.MaxPool2d(2)
        self.layer1 = BasicBlock(width, width, 1)
        self.layer2 = BasicBlock(width, 2 * width, 2)
        self.fc = nn.Linear(2 * width, classes)

    def forward(self, x):
        x = self.layer2(self.layer1(self.pool(self.stem(x))))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def image_data(g, batch=4, size=16, classes=10):
    return (torch.randn(batch, 3, size, size, generator=g),), torch.randint(0, classes, (batch,), generator=g)


# --- convnext --------------------------------------------------------------


class ConvNeXtBlock(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.dwconv = nn.Conv2d(d, d, 7, padding=3, groups=d)
        self.norm = nn.LayerNorm(d, eps=1e-6)
        self.pwconv1 = nn.Linear(d, 4 * d)
        self.pwconv2 = nn.Linear(4 * d, d)
        self.gamma = nn.Parameter(torch.full((d,), 0.1))

    def forward(self, x):
        y = self.dwconv(x).permute(0, 2, 3, 1)  # NCHW -> NHWC
        y = self.pwconv2(F.gelu(self.pwconv1(self.norm(y))))
        return x + (self.gamma * y).permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    def __init__(self, classes=10, d=32):
        super().__init__()
        self.stem = nn.Conv2d(3, d, 4, stride=4)
        self.stem_norm = nn.LayerNorm(d, eps=1e-6)
        self.blocks = nn.Sequential(ConvNeXtBlock(d), ConvNeXtBlock(d))
        self.norm = nn.LayerNorm(d, eps=1e-6)
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        x = self.stem_norm(self.stem(x).permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        x = self.blocks(x)
        return self.head(self.norm(x.mean((-2, -1))))


# --- wav2vec ---------------------------------------------------------------


class Wav2Vec(nn.Module):
    def __init__(self, classes=10, d=64, heads=4):
        super().__init__()
        self.conv0 = nn.Conv1d(1, 32, 10, stride=5, bias=False)
        self.norm0 = nn.GroupNorm(32, 32)
        self.conv1 = nn.Conv1d(32, 32, 3, stride=2, bias=False)
        self.conv2 = nn.Conv1d(32, 32, 2, stride=2, bias=False)
        self.feature_norm = nn.LayerNorm(32)
        self.projection = nn.Linear(32, d)
        self.pos_conv = nn.Conv1d(d, d, 15, padding=7, groups=4)
        self.encoder = nn.ModuleDict(dict(
            attention=SelfAttention(d, heads), ln1=nn.LayerNorm(d),
            ff_in=nn.Linear(d, 2 * d), ff_out=nn.Linear(2 * d, d), ln2=nn.LayerNorm(d)))
        self.classifier = nn.Linear(d, classes)

    def forward(self, wave):
        x = F.gelu(self.norm0(self.conv0(wave[:, None, :])))
        x = F.gelu(self.conv2(F.gelu(self.conv1(x))))
        x = self.projection(self.feature_norm(x.transpose(1, 2)))
        x = x + F.gelu(self.pos_conv(x.transpose(1, 2))).transpose(1, 2)
        e = self.encoder
        x = e["ln1"](x + e["attention"](x))
        x = e["ln2"](x + e["ff_out"](F.gelu(e["ff_in"](x))))
        return self.classifier(x.mean(1))


def audio_data(g, batch=4, samples=800, classes=10):
    return (torch.randn(batch, samples, generator=g),), torch.randint(0, classes, (batch,), generator=g)


def classify_loss(model, inputs, labels):
    return F.cross_entropy(model(*inputs), labels)


def lm_loss(model, inputs, labels):
    logits = model(*inputs)
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


# --- the families ------------------------------------------------------------

FAMILIES = {
    "bert": (Bert, bert_data, lm_loss),
    "t5": (T5, t5_data, lm_loss),
    "llama": (Llama, llama_data, lm_loss),
    "resnet": (ResNet, image_data, classify_loss),
    "convnext": (ConvNeXt, lambda g: image_data(g, size=32), classify_loss),
    "wav2vec": (Wav2Vec, audio_data, classify_loss),
}


def hf_init(model, std=0.02):
    """Initialises like Hugging Face transformers: normal(0, 0.02) weights,
    zero biases, unit norm weights."""
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=std)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)
    return model


def train(family, device, steps=2, seed=0, autocast=None, compile=None):
    """`steps` AdamW steps of `family` on `device`; returns the losses.

    autocast: a dtype name ("bfloat16"): the forward pass and the loss run
    under `torch.autocast` on the device (mixed precision: fp32 parameters
    and optimizer, matmuls in that dtype); None: in float32. compile: a
    torch.compile backend ("aot_eager", "inductor") for the model."""
    make, data, loss_fn = FAMILIES[family]
    mixed = (torch.autocast(device_type=torch.device(device).type, dtype=getattr(torch, autocast))
             if autocast else contextlib.nullcontext())
    torch.manual_seed(seed)
    model = make()
    if family in ("bert", "t5", "llama"):
        hf_init(model)
    g = torch.Generator().manual_seed(seed + 1)
    batches = [data(g) for _ in range(steps)]
    model = model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    run = torch.compile(model, backend=compile) if compile else model
    losses = []
    for inputs, labels in batches:
        inputs = tuple(t.to(device) for t in inputs)
        with mixed:
            loss = loss_fn(run, inputs, labels.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses
