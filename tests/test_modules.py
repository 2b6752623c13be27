"""Where in the model: the module path of each call, the parameter and buffer
names of its tensors, the forward call behind each backward call, and the
source line (cpp/hook/python_hooks.cpp, cpp/rows/param_names.cpp, crates/engine/src/modules.rs).

The test model is written in the style of real ones: nested ModuleLists, a
tied embedding and head, an nn.Sequential inside a custom module, a module
called twice per step, and a module made and first called after enable()."""

import pytest

# The model, two AdamW steps, and a module that only exists after enable().
MODEL = """
import torch.nn as nn
import torch.nn.functional as F


class MLP(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.mlp = MLP(d)
        self.gate = nn.Sequential(nn.Linear(d, d), nn.Sigmoid())

    def forward(self, x):
        h = self.norm(x)
        return x + self.mlp(h) * self.gate(h)


class Stage(nn.Module):
    def __init__(self, d, n):
        super().__init__()
        self.layers = nn.ModuleList(Block(d) for _ in range(n))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class TiedLM(nn.Module):
    def __init__(self, vocab=32, d=16):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.stages = nn.ModuleList([Stage(d, 2), Stage(d, 1)])
        self.shared = nn.Linear(d, d)  # called twice per step
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied

    def forward(self, idx):
        x = self.tok(idx)
        for s in self.stages:
            x = s(x)
        x = self.shared(torch.tanh(self.shared(x)))
        return self.head(x)


torch.manual_seed(0)
model = TiedLM()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = [(torch.randint(0, 32, (4, 6)), torch.randint(0, 32, (4, 6))) for _ in range(2)]
if os.environ.get("TESTJOB_ENABLE") == "1":
    torch.ops.opdump.enable()
late = None
for step, (x, y) in enumerate(data):
    opt.zero_grad()
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    if late is None:
        late = nn.Linear(32, 1)  # made after recording began
    loss = loss + late(model(x)[:, 0]).mean() * 0.0
    loss.backward()
    opt.step()
torch.ops.opdump.flush()
from torch.nn.modules import module as nn_module
print(json.dumps({"loss": float(loss), "hooks": len(nn_module._global_forward_pre_hooks)
                  + len(nn_module._global_forward_hooks), "hooks_module": "_opdump_module_hooks" in sys.modules}))
"""


def calls(table):
    """One row per call (the op-level columns)."""
    return table.drop_duplicates("seq").set_index("seq")


def check_model_dump(t):
    c = calls(t)
    fwd = c[(c.phase == "forward") & (c.step == 0)]
    top = fwd[fwd.depth == 0]

    def modules_of(op):
        return list(top[top.op == op].module)

    # Exact paths, as named_modules() of the root names them; the root by
    # its class.
    assert modules_of("aten::embedding")[0] == "tok"
    layer_norms = modules_of("aten::layer_norm")
    assert layer_norms[:3] == ["stages.0.layers.0.norm", "stages.0.layers.1.norm", "stages.1.layers.0.norm"]
    gelus = modules_of("aten::gelu")
    assert gelus[:3] == ["stages.0.layers.0.mlp", "stages.0.layers.1.mlp", "stages.1.layers.0.mlp"]
    sigmoids = modules_of("aten::sigmoid")
    assert sigmoids[0] == "stages.0.layers.0.gate.1"  # inside the nn.Sequential
    linears = modules_of("aten::linear")
    assert "stages.0.layers.0.mlp.fc1" in linears and "stages.0.layers.0.gate.0" in linears
    assert linears.count("shared") == 2 * 2  # called twice, in each of the two forwards
    assert "late" not in linears and "Linear" in linears  # a root of its own, made after enable()
    assert modules_of("aten::tanh")[0] == "TiedLM"
    assert pd_isnull(modules_of("aten::cross_entropy_loss")[0])  # outside any module
    # Nested calls take the module too.
    addmm = fwd[(fwd.op == "aten::addmm") & (fwd.module == "stages.0.layers.0.mlp.fc1")]
    assert len(addmm) == 2 and (addmm.depth > 0).all()

    # Names: parameters (the tied weight keeps its first name) and buffers.
    rows = t[t.step == 0]
    emb = rows[(rows.op == "aten::embedding") & (rows.role == "input") & (rows.arg == "weight")]
    assert set(emb.name) == {"tok.weight"}
    fc1 = rows[(rows.op == "aten::linear") & (rows.module == "stages.0.layers.0.mlp.fc1") & (rows.role == "input")]
    assert set(fc1.name.dropna()) == {"stages.0.layers.0.mlp.fc1.weight", "stages.0.layers.0.mlp.fc1.bias"}
    head = rows[(rows.op == "aten::linear") & (rows.module == "head") & (rows.role == "input")]
    assert set(head.name.dropna()) == {"tok.weight"}

    # Backward calls point at the forward call whose node they run, and take
    # its module: the mm calls of fc1's backward come from fc1's addmm.
    bwd = c[(c.phase == "backward") & (c.step == 0)]
    fc1_addmm = set(addmm.index)
    mm = bwd[bwd.op == "aten::mm"]
    from_fc1 = mm[mm.fwd_seq.isin(fc1_addmm)]
    assert len(from_fc1) == 2 * len(fc1_addmm), mm[["fwd_seq", "module"]]
    assert set(from_fc1.module) == {"stages.0.layers.0.mlp.fc1"}
    for fs in bwd.fwd_seq.dropna():
        assert int(fs) in c.index and c.loc[int(fs), "phase"] == "forward" and int(fs) < bwd.index.min()
    gb = bwd[bwd.op == "aten::gelu_backward"]
    assert list(c.loc[gb.fwd_seq.astype(int), "op"]) == ["aten::gelu"] * len(gb)
    assert set(gb.module) == set(gelus)

    # The optimizer's tensors: parameters and their gradients, by name.
    opt = t[(t.phase == "optimizer") & (t.step == 1)]
    names = set(opt.name.dropna())
    assert {"stages.0.layers.0.mlp.fc1.weight", "stages.0.layers.0.mlp.fc1.weight.grad",
            "tok.weight", "tok.weight.grad", "shared.bias.grad"} <= names, names
    assert not any(n.startswith("head.") for n in names)  # tied: one parameter, one name
    assert opt[opt.name == "stages.0.layers.0.norm.weight.grad"].arg.isin(["end", "tensor1", "tensor2", "grad"]).any()


def pd_isnull(v):
    import pandas as pd

    return pd.isna(v)


def test_module_paths_names_and_backward_links(run):
    job = run(MODEL, TESTJOB_ENABLE="1")
    assert job.returncode == 0, job.stderr
    assert not job.opdump_lines(), job.opdump_lines()
    r = job.result()
    assert r["hooks"] == 2 and r["hooks_module"], r
    check_model_dump(job.table())


def test_module_paths_under_ld_preload_with_an_unmodified_script(run):
    """The script imports nothing of opdump and never calls it: OPDUMP=1 and
    LD_PRELOAD only (the flush at its end is the only opdump call, and the
    exit would write the same)."""
    job = run(MODEL.replace("torch.ops.opdump.flush()", ""), preload=True, OPDUMP="1")
    assert job.returncode == 0, job.stderr
    check_model_dump(job.table())


def test_jobs_without_dumping_get_no_hooks_and_the_same_numbers(run):
    on = run(MODEL, TESTJOB_ENABLE="1").result()
    loaded_off = run(MODEL).result()  # loaded, OPDUMP unset
    preloaded_off = run(MODEL.replace("torch.ops.opdump.flush()", ""), preload=True, OPDUMP="0").result()
    plain = run(MODEL.replace("torch.ops.opdump.flush()", ""), load=False).result()
    for r in (loaded_off, preloaded_off, plain):
        assert r["hooks"] == 0 and not r["hooks_module"], r
    assert on["loss"] == loaded_off["loss"] == preloaded_off["loss"] == plain["loss"]


def test_plain_torch_job_without_modules(run):
    job = run("""
    torch.ops.opdump.enable()
    x = torch.randn(8, 8, requires_grad=True)
    (x.exp() * 2).sum().backward()
    torch.ops.opdump.flush()
    print(json.dumps(1))
    """)
    assert job.returncode == 0, job.stderr
    t = job.table()
    assert t.module.isna().all() and t.name.isna().all()
    bwd = calls(t)[lambda c: c.phase == "backward"]
    exp_seq = calls(t)[lambda c: c.op == "aten::exp"].index[0]
    assert exp_seq in set(bwd.fwd_seq.dropna().astype(int))  # exp's node


def test_disable_removes_the_hooks_and_opdump_modules_0_installs_none(run):
    code = """
    torch.ops.opdump.enable()
    m = torch.nn.Linear(4, 4)
    m(torch.randn(2, 4))
    from torch.nn.modules import module as nn_module
    during = len(nn_module._global_forward_pre_hooks)
    torch.ops.opdump.disable()
    m(torch.randn(2, 4))   # a bytecode boundary for the pending removal
    after = len(nn_module._global_forward_pre_hooks)
    torch.ops.opdump.flush()
    print(json.dumps([during, after]))
    """
    job = run(code)
    assert job.returncode == 0, job.stderr
    assert job.result() == [1, 0]
    assert set(job.table().module.dropna()) == {"Linear"}
    job = run(code, OPDUMP_MODULES="0")
    assert job.returncode == 0, job.stderr
    assert job.result() == [0, 0]
    assert job.table().module.isna().all()


def test_source_lines_are_opt_in_and_point_at_user_code(run):
    code = """
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU())
    torch.ops.opdump.enable()
    y = m(torch.randn(2, 4))     # line 5 of the job
    y.sum().backward()
    torch.ops.opdump.flush()
    print(json.dumps(1))
    """
    off = run(code)
    assert off.returncode == 0, off.stderr
    assert off.table().source.isna().all()
    on = run(code, OPDUMP_SOURCE="1")
    assert on.returncode == 0, on.stderr
    c = calls(on.table())
    top = c[(c.depth == 0) & (c.phase == "forward")]
    linear = top[top.op == "aten::linear"].iloc[0]
    # The innermost frame of user code: the job's own line, not torch's.
    assert linear.source.startswith("job.py:") and linear.source.endswith(" in <module>"), linear.source
    assert "torch/" not in "".join(top.source.dropna())
    assert c[c.depth > 0].source.isna().all() and c[c.phase == "backward"].source.isna().all()


@pytest.mark.parametrize("bad", ["maybe", "2"])
def test_bad_module_settings_are_one_line(run, bad):
    job = run("print(json.dumps(1))", OPDUMP="1", OPDUMP_MODULES=bad)
    assert job.returncode == 0
    assert any("OPDUMP_MODULES" in l for l in job.opdump_lines()), job.stderr


# A GPT-2-style model: GPT-2's Conv1D (addmm of a bias broadcast over the
# tokens), learned positions, and the token embedding used twice (the
# input and the tied head), so that its gradient is accumulated.
GPT = """
import torch.nn as nn
import torch.nn.functional as F


class Conv1D(nn.Module):
    def __init__(self, nin, nout):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(nin, nout) * 0.02)
        self.bias = nn.Parameter(torch.randn(nout) * 0.02)

    def forward(self, x):
        return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(*x.shape[:-1], -1)


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = Conv1D(d, 3 * d)
        self.attn_proj = Conv1D(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = Conv1D(d, 4 * d)
        self.c_proj = nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        w = (q @ k.transpose(-1, -2)) / math.sqrt(q.size(-1))
        w = w.masked_fill(torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1), float("-inf")).softmax(-1)
        x = x + self.attn_proj((w @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab=50, d=32, heads=4, layers=2, seq=8):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(seq, d)
        self.h = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


import math
torch.manual_seed(0)
model = GPT().to(DEVICE)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
torch.ops.opdump.enable()
for step in range(2):
    idx = torch.randint(0, 50, (2, 8)).to(DEVICE)
    opt.zero_grad()
    F.cross_entropy(model(idx).flatten(0, 1), idx.roll(-1, 1).flatten()).backward()
    opt.step()
torch.ops.opdump.flush()
print(json.dumps({"params": {n: list(p.shape) for n, p in model.named_parameters()}}))
"""


@pytest.mark.parametrize("dev", ["cpu", "testdev"])
def test_engine_work_in_backward_is_linked_to_its_node_or_parameter(run, dev):
    """What the autograd engine runs outside a node's own scope, or in
    AccumulateGrad: the `sum` that reduces a broadcast bias's gradient
    belongs to the forward call of the node it follows (its Conv1D), the
    accumulation of a gradient to the module of its parameter. On testdev
    backward runs on the autograd engine's device thread."""
    job = run(GPT.replace("DEVICE", repr(dev)), testdev=dev == "testdev")
    assert job.returncode == 0, job.stderr
    assert not job.opdump_lines(), job.opdump_lines()
    params = job.result()["params"]
    t = job.table()
    c = calls(t)
    bwd = c[c.phase == "backward"]
    if dev == "testdev":  # the device thread ran backward, not the job's
        assert not set(bwd.thread) & set(c[c.phase == "forward"].thread)
    linked = bwd.fwd_seq.notna() | bwd.module.notna()
    assert linked.mean() >= 0.95, bwd[~linked].op.value_counts().to_dict()

    # The bias-gradient reductions: backward sums whose output has a bias's
    # shape (sum_to keeps the reduced dimension: [1, n]); each is linked to
    # the forward addmm that took that very bias, and has its module.
    def squeezed(shape):
        return [n for n in shape if n != 1]

    out = t[(t.role == "output") & (t.phase == "backward") & (t.op == "aten::sum")].drop_duplicates("seq")
    bias_sums = out[out["shape"].apply(lambda shape: squeezed(shape) in ([3 * 32], [32], [4 * 32]))]
    assert len(bias_sums) >= 2 * 2 * 3  # 3 Conv1D biases per block, 2 blocks, 2 steps
    inputs = t[(t.role == "input") & (t.phase == "forward")]
    for seq, s in bias_sums.set_index("seq").iterrows():
        fwd_seq = c.loc[seq, "fwd_seq"]
        assert not pd_isnull(fwd_seq), (seq, c.loc[seq].to_dict())
        fwd = c.loc[int(fwd_seq)]
        assert fwd.op in ("aten::addmm", "aten::linear"), fwd.op
        bias = inputs[(inputs.seq == int(fwd_seq)) & (inputs.arg.isin(["self", "bias"]))]
        assert len(bias) == 1 and list(bias["shape"].iloc[0]) == squeezed(s["shape"])
        assert c.loc[seq, "module"] == fwd.module and bias.name.iloc[0] == fwd.module + ".bias"

    # Accumulation into a parameter (AccumulateGrad): the module whose
    # parameter it is, with a parameter of the gradient's shape.
    acc = t[(t.phase == "backward") & (t.depth == 0) & (t.op == "aten::detach") & (t.role == "output")]
    assert len(acc) >= len(params), acc.op.value_counts()
    for _, row in acc.iterrows():
        owner = row.module
        assert not pd_isnull(owner), row.to_dict()
        shapes = [shape for name, shape in params.items() if name.rsplit(".", 1)[0] == owner]
        assert list(row["shape"]) in shapes, (owner, list(row["shape"]), shapes)


def test_a_module_made_where_a_freed_one_was_gets_its_own_path(run):
    """The hooks remember each module's path by its id (python_hooks.cpp);
    CPython gives a freed module's memory to the next object of its size, so
    a new root module often gets the id of a freed one. Its calls must carry
    its own path, never the freed module's."""
    job = run("""
    import gc
    import torch.nn as nn

    class Old(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.Linear(4, 4)

        def forward(self, x):
            return self.inner(x)

    class New(nn.Module):
        def forward(self, x):
            return torch.tanh(x)

    torch.ops.opdump.enable()
    x = torch.randn(2, 4)
    reused, freed = 0, set()
    for _ in range(20):
        old = Old()
        old(x)
        freed |= {id(old), id(old.inner)}
        del old
        gc.collect()
        new = New()
        reused += id(new) in freed
        new(x)
        del new
        gc.collect()
    torch.ops.opdump.flush()
    print(json.dumps({"reused": reused}))
    """)
    assert job.returncode == 0, job.stderr
    assert job.result()["reused"] > 0, "no id was reused: the test proves nothing on this interpreter"
    c = calls(job.table())
    tanh = c[c.op == "aten::tanh"]
    assert len(tanh) == 20 and set(tanh.module) == {"New"}, tanh.module.value_counts()
