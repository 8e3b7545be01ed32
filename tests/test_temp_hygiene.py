"""The leftover check itself: it sees kvconform temp folders and sockets (its
negative control), and the session's temp folder is private."""

import os
import socket
import tempfile

from .conftest import temp_items


def test_the_check_sees_kvconform_items_and_sockets(tmp_path):
    assert temp_items(str(tmp_path)) == set()
    (tmp_path / "kvconform-engine-x").mkdir()
    (tmp_path / "unrelated").mkdir()
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(tmp_path / "0b1e-ipc"))
        assert temp_items(str(tmp_path)) == {"kvconform-engine-x", "0b1e-ipc"}
    finally:
        sock.close()


def test_code_under_test_writes_into_the_session_temp_dir(session_temp_dir):
    assert tempfile.gettempdir() == session_temp_dir == os.environ["TMPDIR"]
    with tempfile.TemporaryDirectory(prefix="kvconform-probe-") as d:
        assert os.path.dirname(d) == session_temp_dir


def test_leak_probe():
    """Leaks on purpose when KVCONFORM_LEAK_PROBE is set (see below)."""
    if os.environ.get("KVCONFORM_LEAK_PROBE"):
        tempfile.mkdtemp(prefix="kvconform-leak-")


def test_a_test_that_leaves_a_temp_item_fails():
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q",
         f"{os.path.abspath(__file__)}::test_leak_probe"],
        cwd=root, capture_output=True, text=True, timeout=600,
        env=dict(os.environ, KVCONFORM_LEAK_PROBE="1"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "left behind in the temp folder: ['kvconform-leak-" in proc.stdout
