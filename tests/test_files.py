"""Files: complete after a normal exit, and every visible file reads back
after kill -9 in the middle of a long loop."""

import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq

from conftest import LIB, clean_env


def test_kill_9_leaves_only_complete_files(tmp_path):
    script = tmp_path / "loop.py"
    script.write_text(f"""
import torch, sys
torch.ops.load_library({str(LIB)!r})
x = torch.randn(64, 64)
i = 0
while True:
    x = torch.tanh(x @ x * 0.01)
    i += 1
    if i == 200:
        print("running", flush=True)
""")
    dump = tmp_path / "dump"
    env = clean_env(OPDUMP="1", OPDUMP_DIR=dump, OPDUMP_ROTATE_SECS="0.2", OPDUMP_ROTATE_ROWS="2000")
    p = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "running"
    time.sleep(1.5)
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=30)
    visible = [f for f in dump.rglob("*.parquet") if not f.name.startswith(".")]
    assert len(visible) >= 2
    seqs = []
    for f in visible:
        t = pq.read_table(f)  # raises on an incomplete file
        assert t.num_rows > 0
        assert pq.read_metadata(f).metadata[b"opdump.schema_version"] == b"4"
        seqs += t.column("seq").to_pylist()
    assert len(set(seqs)) > 100
