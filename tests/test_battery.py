"""The battery: six model families in the style of real ones
(tests/battery/models.py), two AdamW steps each on cpu and on testdev, with
opdump preloaded. Two correct devices must not raise an alarm, and a fault
planted on testdev, forward or backward, must be the headline at its first
faulted call."""

import json
from pathlib import Path

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
    assert_headline_at_first_call(cpu_dumps(family), b, res, op, named, phase)


def assert_headline_at_first_call(a, b, res, op, named, phase):
    """The fault planted in `op` fired, and compare names `named` (the op,
    or the aligned call that holds it) at its first call in `phase`: where
    the fault first fired."""
    assert res["fault_counts"].get(f"aten::{op}", 0) > 0, res
    code, report = battery.compare(a, b)
    assert code == 1, battery.describe(report["first_divergence"])
    head = report["headline"]
    assert head is not None and head["op"] == f"aten::{named}", battery.describe(head)
    assert head["phase_a"] == phase
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


# Mixed precision: fp32 on the CPU (the reference) against bf16 autocast on
# testdev. A planted fault must stand out from what bf16 rounding explains,
# an allowance of a few bf16 ulps (2**-8 relative each) on an op that runs
# in bf16: 10% does, and is named at the op's first faulted call. 1% is not
# yet (measured; compare's mixed-precision tolerance is being reworked):
JUDGE_MISSES_1PCT = {
    "silu": "silu runs in bf16: rel err 0.01 under its tolerance 0.0156; the headline is then RMSNorm's "
            "fp32 mul in step 1 (output rel err 1.7e-3, tolerance 9.5e-7, inputs bounded at 5e-5 only)",
    "embedding_dense_backward": "missed: exit 0, no divergence",
}
AUTOCAST_FAMILY = "llama"
AUTOCAST_FAULTS = [
    pytest.param(op, phase, scale, marks=[pytest.mark.xfail(strict=True, reason=JUDGE_MISSES_1PCT[op])]
                 if scale == "1.01" else [])
    for op, phase in [("silu", "forward"), ("embedding_dense_backward", "backward")]
    for scale in ("1.1", "1.01")
] + [pytest.param("silu", "forward", "1.05")]


def matmul_dtypes(dump):
    """{(phase, dtype)} of the outputs of the matmuls (mm, bmm, addmm) in a dump."""
    df = read_dump(dump)
    rows = df[df.op.isin(["aten::mm", "aten::bmm", "aten::addmm"]) & (df.role == "output")]
    return set(zip(rows.phase, rows.dtype))


@pytest.fixture(scope="module")
def autocast_reference(cpu_dumps):
    """The fp32 reference, checked to have run no bf16 matmul."""
    a = cpu_dumps(AUTOCAST_FAMILY)
    assert {dtype for _, dtype in matmul_dtypes(a)} == {"float32"}
    return a


def autocast_dump(tmp_path, fault=None):
    b, res = battery.dump(AUTOCAST_FAMILY, "testdev", tmp_path, fault=fault, autocast="bfloat16")
    # Autocast ran: the linear layers' matmuls are bf16, forward and backward.
    assert {("forward", "bfloat16"), ("backward", "bfloat16")} <= matmul_dtypes(b), matmul_dtypes(b)
    return b, res


def test_autocast_bf16_against_fp32_agrees(autocast_reference, tmp_path):
    b, _ = autocast_dump(tmp_path)
    code, report = battery.compare(autocast_reference, b)
    assert report["headline"] is None, battery.describe(report["headline"])
    assert report["first_divergence"] is None, battery.describe(report["first_divergence"])
    assert code == 0


@pytest.mark.parametrize("op,phase,scale", AUTOCAST_FAULTS)
def test_autocast_planted_fault_is_the_headline(autocast_reference, tmp_path, op, phase, scale):
    b, res = autocast_dump(tmp_path, fault=f"aten::{op}=scale:{scale}")
    assert_headline_at_first_call(autocast_reference, b, res, op, op, phase)


BF16 = "tests.battery.bf16_models"
# bf16's rounding is zero-mean noise, which the statistics barely see: the
# sketch measures the drift a bf16 op's inputs bring (crates/cli/README.md,
# "Tolerance model").
SKETCH = {"OPDUMP_SKETCH": "16"}


@pytest.fixture(scope="module")
def fp32_llama(tmp_path_factory):
    """The Llama in float32 on the CPU: the reference of the bf16 runs."""
    return battery.dump("llama", "cpu", tmp_path_factory.mktemp("llama-fp32"), models=BF16, env_extra=SKETCH)[0]


@pytest.mark.parametrize("evidence", ["sketch", "stats"])
def test_bf16_against_fp32_agrees(fp32_llama, tmp_path, evidence):
    """bf16 on testdev against fp32 on the CPU, no fault: rounding of bf16
    everywhere, no divergence, with the sketch or the statistics alone
    (the casts only the bf16 run makes are no introducers)."""
    b, _ = battery.dump("llama", "testdev", tmp_path, models=BF16, env_extra=SKETCH if evidence == "sketch" else {})
    code, report = battery.compare(fp32_llama, b)
    assert report["headline"] is None, battery.describe(report["headline"])
    assert report["first_introduced_unmatched"] is None, report["first_introduced_unmatched"]
    assert report["op_verdicts"]["introduced"] == 0, report["op_verdicts"]
    assert code == 0, battery.describe(report["first_divergence"])


@pytest.mark.parametrize("evidence", ["sketch", "stats"])
def test_bf16_fault_of_5_percent_in_silu_is_named(fp32_llama, tmp_path, evidence):
    """A 5% fault in bf16's silu, whose input already carries bf16's
    rounding (0.2-0.4%): with the sketch measuring that input error, the
    allowance for it is 8 times it (silu's condition number, twice), not
    32 times (about 10%, which hid the fault); with the statistics alone,
    the scale moves the output's norm by 5%, beyond bf16's tolerance plus
    32 times what the statistics show of the input's drift."""
    b, res = battery.dump("llama", "testdev", tmp_path, fault="aten::silu=scale:1.05", models=BF16,
                          env_extra=SKETCH if evidence == "sketch" else {})
    assert res["fault_counts"].get("aten::silu", 0) > 0, res
    code, report = battery.compare(fp32_llama, b)
    assert code == 1, battery.describe(report["first_divergence"])
    assert report["first_introduced_unmatched"] is None, report["first_introduced_unmatched"]
    head = report["headline"]
    assert head is not None and head["op"] == "aten::silu", battery.describe(head)
    assert head["seq_a"] == first_call(fp32_llama, "silu", "forward"), battery.describe(head)
    assert head["seq_b"] == first_call(b, "silu", "forward"), battery.describe(head)


# Two correct devices over ten steps: slow drift (Adam's steps move the
# parameters apart by rounding) must not read as a divergence, offline or
# online (OPDUMP_REFERENCE). A T5 and a Llama were where it showed first.
LONG = 10


def final_verdict(dump):
    """The final line of online compare's verdicts file."""
    lines = [json.loads(line) for f in sorted(Path(dump).glob("verdicts/rank=0/part-*.jsonl"))
             for line in f.read_text().splitlines() if line.strip()]
    finals = [v for v in lines if v.get("kind") == "final"]
    assert finals, f"no final verdict in {dump}: {lines[-3:]}"
    return finals[-1]


@pytest.fixture(scope="module")
def long_cpu(tmp_path_factory):
    out = tmp_path_factory.mktemp("battery-long")
    cache = {}

    def get(family):
        if family not in cache:
            cache[family] = battery.dump(family, "cpu", out, steps=LONG)[0]
        return cache[family]

    return get


@pytest.mark.parametrize("family", ["t5", "llama"])
def test_ten_steps_of_correct_devices_agree_offline_and_online(long_cpu, tmp_path, family):
    a = long_cpu(family)
    b, _ = battery.dump(family, "testdev", tmp_path, steps=LONG, env_extra={"OPDUMP_REFERENCE": str(a)})
    code, report = battery.compare(a, b)
    assert code == 0, battery.describe(report["first_divergence"])
    final = final_verdict(b)
    assert final["exit_status"] == 0 and final["steps_judged"] >= LONG, final


@pytest.mark.parametrize("family,op", [("t5", "_softmax_backward_data"), ("llama", "silu")])
def test_ten_steps_name_a_fault_of_a_thousandth(long_cpu, tmp_path, family, op):
    a = long_cpu(family)
    b, res = battery.dump(family, "testdev", tmp_path, steps=LONG, fault=f"aten::{op}=scale:1.001",
                          env_extra={"OPDUMP_REFERENCE": str(a)})
    assert res["fault_counts"].get(f"aten::{op}", 0) > 0, res
    code, report = battery.compare(a, b)
    assert code == 1 and report["headline"]["op"] == f"aten::{op}", battery.describe(report["headline"])
    final = final_verdict(b)
    assert final["exit_status"] == 1 and final["headline"]["op"] == f"aten::{op}", final
