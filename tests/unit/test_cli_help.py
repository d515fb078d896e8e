import subprocess
import sys


def test_preemptible_help_lists_subcommands():
    out = subprocess.run(
        [sys.executable, "-m", "preemptible", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "ckpt" in out
    assert "sidecar" in out


def test_version_is_a_flag_and_a_command():
    from preemptible import __version__

    for args in (["--version"], ["version"]):
        out = subprocess.run(
            [sys.executable, "-m", "preemptible", *args], capture_output=True, text=True, check=True
        ).stdout
        assert out.strip() == __version__


def test_completion_scripts_for_bash_zsh_and_fish():
    """`--show-completion` detects the shell it runs in; told not to (as in a test), it takes
    the shell's name. The installed command is what the scripts complete."""
    import os
    from pathlib import Path

    command = str(Path(sys.executable).parent / "preemptible")
    env = {**os.environ, "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}
    for shell, marker in (
        ("bash", "complete -o default -F _preemptible_completion preemptible"),
        ("zsh", "#compdef preemptible"),
        ("fish", "complete --command preemptible"),
    ):
        done = subprocess.run(
            [command, "--show-completion", shell], capture_output=True, text=True, env=env
        )
        assert done.returncode == 0 and marker in done.stdout, (shell, done.stdout[:300])


def test_help_shows_no_type_markers():
    """Typer writes `<bool>` beside every flag and `<int>` for a number; click's plain kinds
    (INTEGER, TEXT, PATH) and nothing for a flag read better."""
    import os
    import re

    env = {**os.environ, "COLUMNS": "100"}
    for command in (
        [], ["queue"], ["queue", "submit"], ["queue", "status"], ["queue", "serve"],
        ["sim"], ["ckpt", "list"], ["launch"], ["sidecar"],
    ):  # fmt: skip
        out = subprocess.run(
            [sys.executable, "-m", "preemptible", *command, "--help"],
            capture_output=True, text=True, check=True, env=env,
        ).stdout  # fmt: skip
        assert not re.search(r"<(bool|str|int|float|list\[str\]|path)\b", out), (command, out)
    submit = subprocess.run(
        [sys.executable, "-m", "preemptible", "queue", "submit", "--help"],
        capture_output=True, text=True, check=True, env=env,
    ).stdout  # fmt: skip
    assert re.search(r"--gpus\s+INTEGER", submit) and re.search(r"--cwd\s+PATH", submit)
