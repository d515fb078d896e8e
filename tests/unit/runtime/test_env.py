"""RunEnv from real launcher environments, and the warnings of check_signal_setup."""

from __future__ import annotations

import signal

import pytest

from preemptible.errors import ConfigError
from preemptible.runtime.env import RunEnv, check_signal_setup, parse_signal_list

# What a torchrun worker sees (rank 1, attempt 1, --rdzv-id=job42), measured under torch 2.13.
TORCHRUN_WORKER = {
    "RANK": "1",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "2",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "0",
    "MASTER_ADDR": "localhost",
    "MASTER_PORT": "40803",
    "TORCHELASTIC_RESTART_COUNT": "1",
    "TORCHELASTIC_MAX_RESTARTS": "2",
    "TORCHELASTIC_RUN_ID": "job42",
    "TORCHELASTIC_USE_AGENT_STORE": "True",
    "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
    "OMP_NUM_THREADS": "1",
}
SLURM_JOB = {"SLURM_JOB_ID": "7", "SLURM_JOB_PARTITION": "batch", "SLURM_RESTART_COUNT": "2"}


def test_a_plain_process_is_rank_zero_of_one_and_under_nothing():
    run_env = RunEnv.from_env({})
    assert run_env == RunEnv()
    assert (run_env.rank, run_env.world_size, run_env.restart_count) == (0, 1, 0)
    assert not (run_env.under_torchrun or run_env.under_slurm or run_env.on_kubernetes)
    assert run_env.torchrun_shutdown_timeout is None and run_env.torchrun_handled_signals == ()


def test_a_torchrun_worker_environment_is_read_completely():
    run_env = RunEnv.from_env(TORCHRUN_WORKER)
    assert (run_env.rank, run_env.local_rank, run_env.world_size, run_env.local_world_size) == (
        1,
        1,
        2,
        2,
    )
    assert run_env.restart_count == 1 and run_env.run_id == "job42"
    assert run_env.under_torchrun
    assert run_env.torchrun_shutdown_timeout == 30.0  # torchrun's default; the flag is invisible
    assert run_env.torchrun_handled_signals == (
        signal.SIGTERM,
        signal.SIGINT,
        signal.SIGHUP,
        signal.SIGQUIT,
    )


def test_the_restart_count_alone_means_torchrun():
    assert RunEnv.from_env({"TORCHELASTIC_RESTART_COUNT": "0"}).under_torchrun


def test_a_visible_shutdown_timeout_is_used():
    env = {**TORCHRUN_WORKER, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "5"}
    assert RunEnv.from_env(env).torchrun_shutdown_timeout == 5.0


def test_torchrun_without_the_signal_list_handles_its_default_signals():
    env = {k: v for k, v in TORCHRUN_WORKER.items() if k != "TORCHELASTIC_SIGNALS_TO_HANDLE"}
    assert signal.SIGTERM in RunEnv.from_env(env).torchrun_handled_signals
    assert signal.SIGUSR1 not in RunEnv.from_env(env).torchrun_handled_signals


def test_slurm_kubernetes_and_launch_are_detected():
    env = {
        **SLURM_JOB,
        "KUBERNETES_SERVICE_HOST": "10.0.0.1",
        "PREEMPTIBLE_LAUNCH_PID": "123",
        "PREEMPTIBLE_LAUNCH_TRANSLATES": "SIGUSR1,SIGUSR2",
    }
    run_env = RunEnv.from_env(env)
    assert run_env.under_slurm and run_env.slurm_job_id == "7" and run_env.slurm_restart_count == 2
    assert run_env.on_kubernetes and run_env.under_launch
    assert run_env.launch_translates == (signal.SIGUSR1, signal.SIGUSR2)


@pytest.mark.parametrize(
    "name, value",
    [
        ("RANK", "one"),
        ("WORLD_SIZE", "2.5"),
        ("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "-1"),
        ("TORCHELASTIC_SIGNALS_TO_HANDLE", "SIGTERM,SIGNOPE"),
    ],
)
def test_a_bad_variable_is_a_config_error_naming_it(name, value):
    with pytest.raises(ConfigError, match=name):
        RunEnv.from_env({**TORCHRUN_WORKER, name: value})


def test_signal_lists_accept_names_short_names_and_numbers_without_duplicates():
    assert parse_signal_list(" SIGTERM, usr1 ,15,,10") == (signal.SIGTERM, signal.SIGUSR1)


# --- check_signal_setup ------------------------------------------------------------------------


def test_a_save_longer_than_torchruns_shutdown_timeout_is_a_warning_that_says_how_to_fix_it():
    (warning,) = check_signal_setup(RunEnv.from_env(TORCHRUN_WORKER), 45.0)
    assert "30s" in warning and "45.0s" in warning
    assert "--shutdown-timeout=78" in warning and "TORCH_ELASTIC_SHUTDOWN_TIMEOUT=78" in warning


def test_a_save_within_the_shutdown_timeout_is_fine():
    assert check_signal_setup(RunEnv.from_env(TORCHRUN_WORKER), 12.0) == []
    assert check_signal_setup(RunEnv.from_env(TORCHRUN_WORKER), None) == []


def test_outside_torchrun_the_shutdown_timeout_does_not_matter():
    assert check_signal_setup(RunEnv.from_env({}), 500.0) == []


def test_torchrun_under_slurm_without_usr1_handling_warns_about_orphaned_workers():
    (warning,) = check_signal_setup(RunEnv.from_env({**TORCHRUN_WORKER, **SLURM_JOB}), None)
    assert "SIGUSR1" in warning and "orphan" in warning
    assert "preemptible launch" in warning and "--signal=B:USR1" in warning


def test_preemptible_launch_translating_usr1_silences_the_slurm_warning():
    env = {**TORCHRUN_WORKER, **SLURM_JOB, "PREEMPTIBLE_LAUNCH_PID": "1"}
    env["PREEMPTIBLE_LAUNCH_TRANSLATES"] = "SIGUSR1"
    assert check_signal_setup(RunEnv.from_env(env), None) == []


def test_torchrun_handling_usr1_itself_silences_the_slurm_warning():
    env = {**TORCHRUN_WORKER, **SLURM_JOB}
    env["TORCHELASTIC_SIGNALS_TO_HANDLE"] = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
    assert check_signal_setup(RunEnv.from_env(env), None) == []


def test_torchrun_not_handling_sigterm_is_a_warning():
    env = {**TORCHRUN_WORKER, "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGINT"}
    (warning,) = check_signal_setup(RunEnv.from_env(env), None)
    assert "does not handle SIGTERM" in warning and "--signals-to-handle" in warning
