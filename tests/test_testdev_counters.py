"""What testdev counts: memory, host waits and kernel launches, and the
costs that make waits and launches take time. (The testdev test device:
tests/testdev/; shared helpers: tests/testdev_common.py.)

    .venv/bin/python -m pytest tests/test_testdev_counters.py -q
"""

from __future__ import annotations

import threading
import time

import pytest
import torch
import torch.nn.functional as F

import tests.testdev as testdev
from testdev_common import D, bits_equal, device_randn, run_python

# The fixtures these tests use (the first two autouse): imported, they apply here.
from testdev_common import _loaded as _loaded
from testdev_common import _no_faults as _no_faults
from testdev_common import no_gc as no_gc


def test_memory_counts_allocations_frees_and_the_peak(no_gc):
    base = testdev.memory_allocated()
    testdev.reset_peak_memory_stats()
    assert testdev.max_memory_allocated() == base
    x = torch.empty(1000, device=D)
    y = torch.empty(250, dtype=torch.float64, device=D)
    assert testdev.memory_allocated() == base + 6000
    del x
    assert testdev.memory_allocated() == base + 2000
    assert testdev.max_memory_allocated() == base + 6000
    testdev.reset_peak_memory_stats()
    assert testdev.max_memory_allocated() == base + 2000
    y.resize_(500)  # a new block from the allocator, the old one given back
    assert testdev.memory_allocated() == base + 4000
    assert testdev.max_memory_allocated() == base + 6000  # both, during the copy
    mod = torch.get_device_module(D)
    assert mod.memory_allocated() == testdev.memory_allocated()
    assert mod.max_memory_allocated() == testdev.max_memory_allocated()
    del y
    assert testdev.memory_allocated() == base
    mod.reset_peak_memory_stats()
    assert testdev.max_memory_allocated() == base


def test_memory_counts_the_outputs_direct_kernels_adopt(no_gc):
    n = 1 << 16
    x = device_randn(n=n)
    base = testdev.memory_allocated()
    a = x.abs()  # the CPU kernel's output, adopted by the device without a copy
    s = x.sum()
    assert a.device.type == D and s.device.type == D
    assert testdev.memory_allocated() == base + 4 * n + 4
    del a, s
    assert testdev.memory_allocated() == base
    b = x.abs()
    b.resize_(2 * n)  # an adopted output grows like any testdev tensor
    assert testdev.memory_allocated() == base + 8 * n
    del b
    assert testdev.memory_allocated() == base


def test_host_waits_count_blocking_reads_and_synchronisations():
    x = device_randn(n=16)
    on_host = x.cpu()
    testdev.set_job_thread()
    testdev.reset_counters()

    def waits_after(fn):
        fn()
        return testdev.host_waits()["job"]

    assert waits_after(lambda: x.cpu()) == 1
    assert waits_after(lambda: x.sum().item()) == 2
    assert waits_after(lambda: x.to("cpu", torch.float64)) == 3
    assert waits_after(lambda: torch.empty(16).copy_(x)) == 4
    # A non_blocking copy to the host is not a wait (and the data is there).
    out = torch.empty(16)
    assert waits_after(lambda: out.copy_(x, non_blocking=True)) == 4
    assert bits_equal(out, on_host)
    assert waits_after(lambda: torch.get_device_module(D).synchronize()) == 5
    assert waits_after(lambda: torch.accelerator.synchronize()) == 6
    stream = torch.Stream(device=D)
    assert waits_after(lambda: stream.synchronize()) == 7
    event = torch.Event(device=D)
    event.record(stream)
    assert waits_after(lambda: event.synchronize()) == 8
    # Copies to the device and on it, and ops, are not waits.
    assert waits_after(lambda: (torch.ones(4).to(D), x.clone(), x.double(), F.gelu(x))) == 8
    assert testdev.host_waits() == {"job": 8, "other": 0}
    worker = threading.Thread(target=x.cpu)
    worker.start()
    worker.join()
    assert testdev.host_waits() == {"job": 8, "other": 1}
    testdev.reset_counters()
    assert testdev.host_waits() == {"job": 0, "other": 0}


def test_launches_count_each_kernel_once_by_thread_and_observer():
    x = device_randn(n=16)
    testdev.set_job_thread()
    testdev.reset_counters()
    F.gelu(x)  # the fallback, its copies to and from the host included
    x.abs()  # a direct kernel
    x.cpu()  # _copy_from
    torch.empty(4, device=D)  # allocation and views are not launches
    x.view(4, 4).t()
    assert testdev.launches() == {"job": 3, "other": 0, "observer": 0}
    testdev.call_unobserved("aten::gelu", x)
    testdev.call_unobserved("aten::abs", x)
    assert testdev.launches() == {"job": 5, "other": 0, "observer": 2}
    worker = threading.Thread(target=x.abs)
    worker.start()
    worker.join()
    assert testdev.launches() == {"job": 5, "other": 1, "observer": 2}
    testdev.reset_counters()
    assert testdev.launches() == {"job": 0, "other": 0, "observer": 0}


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def test_costs_make_waits_and_launches_take_time():
    x = device_randn(n=16)
    testdev.set_costs(sync_us=50_000)
    assert testdev.costs() == {"sync_us": 50_000.0, "launch_us": 0.0}
    assert _seconds(x.cpu) >= 0.05  # a launch (free) and a wait
    assert _seconds(x.abs) < 0.05  # a launch only
    testdev.set_costs(launch_us=50_000)  # sync_us stays
    assert testdev.costs() == {"sync_us": 50_000.0, "launch_us": 50_000.0}
    assert _seconds(x.abs) >= 0.05
    assert _seconds(x.cpu) >= 0.1
    for bad in [{"sync_us": -1}, {"launch_us": float("nan")}, {"sync_us": 1, "launch_us": float("inf")}]:
        with pytest.raises(ValueError, match="microseconds"):
            testdev.set_costs(**bad)
    assert testdev.costs() == {"sync_us": 50_000.0, "launch_us": 50_000.0}
    testdev.set_costs(sync_us=0, launch_us=2.5)
    assert testdev.costs() == {"sync_us": 0.0, "launch_us": 2.5}


def test_cost_env_vars_are_read_at_load():
    res = run_python(
        """
        testdev.load()
        print(testdev.costs(), testdev.direct_enabled())
        """,
        TESTDEV_SYNC_US="250",
        TESTDEV_LAUNCH_US=" 1.5 ",
        TESTDEV_DIRECT="1",
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "{'sync_us': 250.0, 'launch_us': 1.5} True"


def test_bad_settings_env_vars_raise_at_load():
    res = run_python(
        """
        try:
            testdev.load()
        except ValueError as e:
            print("ValueError:", e)
        print(testdev.costs(), testdev.direct_enabled())
        """,
        TESTDEV_SYNC_US="fast",
        TESTDEV_LAUNCH_US="3",
        TESTDEV_DIRECT="yes",
    )
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("ValueError: testdev: bad environment:")
    assert 'TESTDEV_SYNC_US="fast"' in lines[0] and 'TESTDEV_DIRECT="yes"' in lines[0]
    assert "TESTDEV_LAUNCH_US" not in lines[0]
    assert lines[1] == "{'sync_us': 0.0, 'launch_us': 3.0} True"  # the bad ones keep their defaults
