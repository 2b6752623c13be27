"""Every thread is observed once dumping is on; backward and optimizer ops
carry their phase; steps advance at each Optimizer.step."""

import pytest


def test_user_thread_backward_and_optimizer(run):
    job = run("""
    import threading
    torch.ops.opdump.enable()
    def work():
        for _ in range(5):
            torch.ones(3).mul(2.0)
    th = threading.Thread(target=work)
    th.start(); th.join()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(3):
        opt.zero_grad()
        loss = model(torch.randn(4, 8)).pow(2).mean()
        loss.backward()
        opt.step()
    torch.ops.opdump.flush()
    print(json.dumps({"main": threading.get_native_id()}))
    """, OPDUMP=0)
    assert job.returncode == 0, job.stderr
    main = job.result()["main"]
    t = job.table().drop_duplicates("seq")
    mul = t[(t.op == "aten::mul") & (t.phase == "forward") & (t.thread != main)]
    # The thread's first op switches the key on and is missed; the rest are seen.
    assert len(mul) >= 4, t[t.thread != main][["seq", "op", "thread"]]
    assert t.seq.is_unique

    bw = t[t.phase == "backward"]
    assert {"aten::tanh_backward", "aten::mm"} <= set(bw.op)
    opt_ops = t[t.phase == "optimizer"]
    assert len(opt_ops) > 0
    # Steps: forward and backward of iteration k, and its optimizer ops, are step k.
    assert sorted(opt_ops.step.unique()) == [0, 1, 2]
    assert sorted(bw.step.unique()) == [0, 1, 2]
    for k in range(3):
        fw_k = t[(t.phase == "forward") & (t.step == k) & (t.op == "aten::addmm")]
        assert len(fw_k) == 2, (k, fw_k)


def test_explicit_step_takes_over(run):
    job = run("""
    torch.ops.opdump.enable()
    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([p], lr=0.1)
    torch.ones(1).add(1)         # step 0
    n = torch.ops.opdump.step()  # the job counts its steps itself now
    p.sum().backward(); opt.step(); opt.step()  # no automatic advance
    torch.ones(1).sub(1)
    torch.ops.opdump.flush()
    print(json.dumps(n))
    """)
    assert job.returncode == 0, job.stderr
    assert job.result() == 1
    t = job.table().drop_duplicates("seq")
    assert t[t.op == "aten::add"].step.tolist() == [0]
    assert t[t.op == "aten::sub"].step.tolist() == [1]



ENGINE_JOB = """
import threading
import torch.utils.checkpoint as cp
torch.manual_seed(0)
dev = DEVICE
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 8)   # biased: on [B, T, D] the bias gradient
        self.b = torch.nn.Linear(8, 8)   # is the engine's sum_to over two dims
        self.c = torch.nn.Linear(8, 8)
    def forward(self, x):
        h = torch.tanh(self.a(x))
        h.register_hook(lambda g: g * 1.0)                  # user code in a hook
        y = self.b(h) + h                                   # h used twice: accumulated
        if dev == "cpu":  # (checkpoint needs an autocast module testdev lacks)
            y = cp.checkpoint(self.c, y, use_reentrant=True)  # reentrant backward
        else:
            y = self.c(y)
        return y.pow(2).mean()
net = Net().to(dev)
opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
def final():                                            # runs after the last node
    torch.ones(2, device=dev).mul(3.0)
def queue_final(g):
    torch.autograd.Variable._execution_engine.queue_callback(final)
    return g
torch.ops.opdump.enable()
for step in range(2):
    opt.zero_grad(set_to_none=False)
    loss = net(torch.randn(2, 5, 8, device=dev))
    loss.register_hook(queue_final)
    loss.backward()
    opt.step()
torch.ones(4, device=dev).sum()                         # outside any backward
torch.ops.opdump.flush()
print(json.dumps(threading.get_native_id()))
"""


@pytest.mark.parametrize("dev", ["cpu", "testdev"])
def test_engine_work_is_backward(run, dev):
    """What the autograd engine runs outside a node's own scope (validate_outputs'
    sum_to, the input buffers' accumulation, final callbacks), and user hooks,
    are backward, on the device's autograd thread too; zero_grad is the
    optimizer's; the rest of the job is forward."""
    job = run(ENGINE_JOB.replace("DEVICE", repr(dev)), testdev=dev == "testdev")
    assert job.returncode == 0, job.stderr
    main = job.result()
    rows = job.table()
    t = rows.drop_duplicates("seq").sort_values("seq")
    # The op that opens a record_function scope is entered before it: the
    # optimizer's `_record_function_enter_new` is not in its phase.
    top = t[(t.depth == 0) & ~t.op.str.startswith("profiler::")]
    for step in (0, 1):
        s = top[top.step == step]
        bw = s[s.phase == "backward"]
        fw = s[s.phase == "forward"]
        opt = s[s.phase == "optimizer"]
        # Nothing between the first and the last backward call is forward.
        span = s[(s.seq > bw.seq.min()) & (s.seq < bw.seq.max())]
        assert set(span.phase) == {"backward"}, span[span.phase != "backward"][["seq", "op", "phase"]]
        # The sum_to of the three bias gradients: [10, 8] summed to [1, 8].
        bias = rows[(rows.op == "aten::sum") & (rows.step == step) & (rows.role == "output")
                    & rows["shape"].map(lambda x: x is not None and list(x) == [1, 8])]
        assert len(bias) >= 3 and set(bias.phase) == {"backward"}, bias[["seq", "depth", "phase"]]
        # h's two gradients added up; the hook's g * 1.0; the final callback.
        assert {"aten::add", "aten::add_"} & set(bw.op), sorted(set(bw.op))
        assert {"aten::mul", "aten::ones"} <= set(bw.op), sorted(set(bw.op))
        assert {"aten::linear", "aten::tanh", "aten::pow", "aten::mean"} <= set(fw.op)
        assert fw.seq.max() < bw.seq.min()
        assert any("addcdiv" in op for op in opt.op), sorted(set(opt.op))  # AdamW (foreach off the CPU)
        # zero_grad(set_to_none=False) zeroes the gradients in the optimizer's
        # phase, and does not end a step.
        zero = s[s.op == "aten::zero_"]
        if step == 1:
            assert len(zero) == 6 and set(zero.phase) == {"optimizer"}
            assert zero.seq.max() < fw.seq.min()
    if dev == "testdev":
        bias = rows[(rows.op == "aten::sum") & (rows.tensor_device == "testdev:0") & (rows.phase == "backward")]
        assert len(bias) > 0 and (bias.thread != main).all(), "the engine's work on the device thread"
    after = top[top.seq > top[top.phase == "optimizer"].seq.max()]
    assert list(after.op) == ["aten::ones", "aten::sum"] and set(after.phase) == {"forward"}
