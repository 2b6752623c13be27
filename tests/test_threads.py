"""Every thread is observed once dumping is on; backward and optimizer ops
carry their phase; steps advance at each Optimizer.step."""


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
