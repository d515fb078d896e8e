import subprocess
import sys


def test_preemptible_help_lists_subcommands():
    out = subprocess.run(
        [sys.executable, "-m", "preemptible", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "ckpt" in out
    assert "sidecar" in out
