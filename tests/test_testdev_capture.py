"""Graph capture on testdev: what a capture refuses and counts, and the
stream-capturing query in either load order. (The testdev test device:
tests/testdev/; shared helpers: tests/testdev_common.py.)

    .venv/bin/python -m pytest tests/test_testdev_capture.py -q
"""

from __future__ import annotations

import textwrap

import pytest
import torch

import tests.testdev as testdev
from conftest import LIB
from testdev_common import D, device_randn, run_python

# The fixtures these tests use (the first two autouse): imported, they apply here.
from testdev_common import _loaded as _loaded
from testdev_common import _no_faults as _no_faults


def test_capture_refuses_host_waits_and_counts_observer_launches():
    x = device_randn(n=16)
    testdev.reset_counters()
    with testdev.capture():
        assert testdev.capturing()
        y = x.abs()  # the program's own work is captured, and fine
        with pytest.raises(RuntimeError, match="testdev: host wait while the stream is capturing"):
            x.cpu()
        with pytest.raises(RuntimeError, match="capturing"):
            y.sum().item()
        with pytest.raises(RuntimeError, match="capturing"):
            torch.get_device_module(D).synchronize()
        testdev.call_unobserved("aten::abs", x)  # an observer launching: counted
        testdev.call_unobserved("aten::gelu", x)
        with pytest.raises(RuntimeError, match="already capturing"):
            with testdev.capture():
                pass
        assert testdev.capturing()
    assert not testdev.capturing()
    assert testdev.capture_counts() == {"observer_launches": 2, "waits": 3}
    assert testdev.host_waits() == {"job": 0, "other": 0}  # the refused waits did not happen
    testdev.call_unobserved("aten::abs", x)
    x.cpu()  # after the capture: an ordinary launch and wait again
    assert testdev.capture_counts() == {"observer_launches": 2, "waits": 3}
    assert sum(testdev.host_waits().values()) == 1
    with pytest.raises(RuntimeError, match="capture_end without capture_begin"):
        torch.ops.testdev.capture_end()
    testdev.reset_counters()
    assert testdev.capture_counts() == {"observer_launches": 0, "waits": 0}


_DEFINE_STREAM_CAPTURING = 'torch.library.define("opdump::stream_capturing", "(Tensor t) -> bool")'
_ASK_STREAM_CAPTURING = """
x = torch.ones(2, device="testdev")
answers = [torch.ops.opdump.stream_capturing(x)]
with testdev.capture():
    answers.append(torch.ops.opdump.stream_capturing(x))
answers.append(torch.ops.opdump.stream_capturing(x))
print(answers)
"""


@pytest.mark.parametrize("schema_first", [True, False])
def test_stream_capturing_kernel_answers_in_either_order(schema_first):
    """testdev implements opdump::stream_capturing before or after the schema
    exists (here defined by the test, as opdump is not loaded)."""
    steps = [_DEFINE_STREAM_CAPTURING, "testdev.load()"]
    res = run_python("\n".join(steps if schema_first else steps[::-1]) + _ASK_STREAM_CAPTURING)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[False, True, False]"


@pytest.mark.parametrize("opdump_first", [True, False])
def test_stream_capturing_with_libopdump_in_either_order(opdump_first):
    steps = [f"torch.ops.load_library({str(LIB)!r})", "testdev.load()"]
    check = """
    try:
        torch._C._dispatch_find_schema_or_throw("opdump::stream_capturing", "")
    except RuntimeError:
        print("no schema")
        raise SystemExit
    """
    code = "\n".join(steps if opdump_first else steps[::-1]) + textwrap.dedent(check) + _ASK_STREAM_CAPTURING
    res = run_python(code)
    assert res.returncode == 0, res.stderr
    if res.stdout.strip() == "no schema":
        pytest.skip("this libopdump does not define opdump::stream_capturing")
    assert res.stdout.strip() == "[False, True, False]"
