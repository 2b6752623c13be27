"""Probes of issue 44 on the plugin's bad values: a seconds or size variable
past its range is one `opdump:` line that names it and says what is
accepted, never a Rust panic, and the job runs on unchanged
(crates/engine/src/config.rs). The CLI's and the engine's file probes are
Rust tests: crates/cli/tests/cli/probe_files.rs, crates/engine/tests/engine/jsonl_files.rs,
crates/load/tests/load/chunk_sums.rs."""

import pytest

JOB = """
x = torch.arange(10.0)
print(json.dumps(float((x * 2).sum())))
"""


@pytest.mark.parametrize("name,value", [
    ("OPDUMP_CHECK_SECONDS", "1e20"),
    ("OPDUMP_ROTATE_SECS", "1e20"),
    ("OPDUMP_QUEUE_WAIT_MS", "18446744073709551615"),
    ("OPDUMP_QUEUE", "99999999999999"),
])
def test_a_value_out_of_range_is_one_line(run, name, value):
    env = {"OPDUMP": "1", name: value}
    if name == "OPDUMP_CHECK_SECONDS":
        env["OPDUMP_CHECK"] = "1"
    job = run(JOB, **env)
    assert job.returncode == 0, job.stderr
    assert "panicked" not in job.stderr, job.stderr
    assert job.result() == 90.0
    naming = [l for l in job.stderr.splitlines() if name in l]
    assert len(naming) == 1, job.stderr
    assert naming[0].startswith(f'opdump: {name}="{value}" is not valid: '), naming
    assert "at most" in naming[0] or " to " in naming[0], naming
    assert not job.dump_dir.exists()
