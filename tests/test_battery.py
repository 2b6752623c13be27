"""The battery: six model families in the style of real ones
(tests/battery/models.py), two AdamW steps each on cpu and on testdev, with
opdump preloaded. Two correct devices must not raise an alarm, and a fault
planted on testdev, forward or backward, must be the headline at its first
faulted call."""

import pytest

from conftest import read_dump
from tests.battery import run as battery
from tests.battery.models import FAMILIES

# Per family: an op of the forward pass and one of the backward pass that
# reach testdev's CPU fallback (where faults are planted), and the op the
# headline must name: the same, or for a convolution the aligned op that
# calls the device's hook (`_convolution` over `convolution_overrideable`,
# which the CPU does not have).
FAULTS = {
    "bert": [("gelu", "forward", "gelu"), ("gelu_backward", "backward", "gelu_backward")],
    "t5": [("_softmax", "forward", "_softmax"), ("_softmax_backward_data", "backward", "_softmax_backward_data")],
    "llama": [("silu", "forward", "silu"), ("embedding_dense_backward", "backward", "embedding_dense_backward")],
    "resnet": [("convolution_overrideable", "forward", "_convolution"),
               ("native_batch_norm_backward", "backward", "native_batch_norm_backward")],
    "convnext": [("convolution_overrideable", "forward", "_convolution"),
                 ("native_layer_norm_backward", "backward", "native_layer_norm_backward")],
    "wav2vec": [("gelu", "forward", "gelu"), ("convolution_backward_overrideable", "backward", "convolution_backward")],
}


@pytest.fixture(scope="module")
def cpu_dumps(tmp_path_factory):
    """The reference run of each family, made once."""
    out = tmp_path_factory.mktemp("battery-cpu")
    cache = {}

    def get(family):
        if family not in cache:
            cache[family] = battery.dump(family, "cpu", out)[0]
        return cache[family]

    return get


def first_call(dump, op, phase):
    """seq of the first call of `op` (any overload) in `phase`."""
    df = read_dump(dump)
    rows = df[(df.op == f"aten::{op}") & (df.phase == phase)]
    assert len(rows), f"no {op} in the {phase} phase of {dump}"
    return int(rows.seq.min())


@pytest.mark.parametrize("family", list(FAMILIES))
def test_fault_free_devices_agree(cpu_dumps, tmp_path, family):
    b, _ = battery.dump(family, "testdev", tmp_path)
    code, report = battery.compare(cpu_dumps(family), b)
    assert report["headline"] is None, battery.describe(report["headline"])
    assert report["first_divergence"] is None, battery.describe(report["first_divergence"])
    assert code == 0


@pytest.mark.parametrize("family,op,phase,named", [(f, *fault) for f, faults in FAULTS.items() for fault in faults])
def test_planted_fault_is_the_headline_at_its_first_call(cpu_dumps, tmp_path, family, op, phase, named):
    b, res = battery.dump(family, "testdev", tmp_path, fault=f"aten::{op}=scale:1.01")
    assert res["fault_counts"].get(f"aten::{op}", 0) > 0, res
    a = cpu_dumps(family)
    code, report = battery.compare(a, b)
    assert code == 1, battery.describe(report["first_divergence"])
    head = report["headline"]
    assert head is not None and head["op"] == f"aten::{named}", battery.describe(head)
    assert head["phase_a"] == phase
    # The first call of the op is where the fault first fired.
    assert head["seq_a"] == first_call(a, named, phase), battery.describe(head)
    assert head["seq_b"] == first_call(b, named, phase), battery.describe(head)


def test_fault_after_a_cancelled_bias_gradient_is_the_headline(cpu_dumps, tmp_path):
    """The key bias's gradient (a sum over tokens, zero in exact arithmetic)
    comes before the embedding's gradient in backward; its rounding must
    not take the headline from a real fault after it."""
    a = cpu_dumps("bert")
    df = read_dump(a)
    # The cancelled reduction is there, and comes first.
    sums = df[(df.op == "aten::sum") & (df.phase == "backward")]
    assert len(sums)
    b, res = battery.dump("bert", "testdev", tmp_path, fault="aten::embedding_dense_backward=scale:1.01")
    assert res["fault_counts"]["aten::embedding_dense_backward"] > 0
    code, report = battery.compare(a, b)
    assert code == 1
    head = report["headline"]
    assert head["op"] == "aten::embedding_dense_backward", battery.describe(head)
    assert int(sums.seq.min()) < head["seq_a"]
