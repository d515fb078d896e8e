"""discover_grace: precedence of sources, bad values, and the scontrol parsers on real output."""

from __future__ import annotations

from datetime import datetime

import pytest

from preemptible.errors import ConfigError
from preemptible.runtime.deadline import (
    Grace,
    GraceCheck,
    _run,
    discover_grace,
    parse_end_time,
    parse_grace_time,
    parse_scontrol_record,
    parse_signal_spec,
)

# `scontrol show job -o 7` and `scontrol show partition -o batch`, SLURM 22.05 (Debian 12), from
# a single-node SLURM 22.05 cluster (fields as printed; paths shortened).
JOB_RUNNING = (
    "JobId=7 JobName=low.sh UserId=testuser(1001) GroupId=testuser(1001) MCS_label=N/A "
    "Priority=1 Nice=0 Account=(null) QOS=(null) JobState=RUNNING Reason=None "
    "Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=0:0 RunTime=00:00:12 "
    "TimeLimit=00:02:00 TimeMin=N/A SubmitTime=2026-11-29T10:13:00 "
    "EligibleTime=2026-11-29T10:13:00 AccrueTime=2026-11-29T10:13:00 "
    "StartTime=2026-11-29T10:13:00 EndTime=2026-11-29T10:15:00 Deadline=N/A "
    "PreemptEligibleTime=2026-11-29T10:13:00 PreemptTime=None SuspendTime=None "
    "SecsPreSuspend=0 LastSchedEval=2026-11-29T10:13:00 Scheduler=Main Partition=batch "
    "AllocNode:Sid=localhost:4242 ReqNodeList=(null) ExcNodeList=(null) NodeList=localhost "
    "BatchHost=localhost NumNodes=1 NumCPUs=4 NumTasks=1 CPUs/Task=4 ReqB:S:C:T=0:0:*:* "
    "TRES=cpu=4,node=1,billing=4,gres/gpu=4 Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* "
    "MinCPUsNode=4 MinMemoryNode=0 MinTmpDiskNode=0 Features=(null) DelayBoot=00:00:00 "
    "OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) "
    "Command=/tmp/slurm-smoke.Ab12/low.sh WorkDir=/tmp/slurm-smoke.Ab12 "
    "Comment=ckpt save took 3s StdErr=/tmp/slurm-smoke.Ab12/low.out StdIn=/dev/null "
    "StdOut=/tmp/slurm-smoke.Ab12/low.out Power= TresPerNode=gres:gpu:4\n"
)
JOB_UNLIMITED = JOB_RUNNING.replace("TimeLimit=00:02:00", "TimeLimit=UNLIMITED").replace(
    "EndTime=2026-11-29T10:15:00", "EndTime=Unknown"
)
PARTITION_BATCH = (
    "PartitionName=batch AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL "
    "Default=YES QoS=N/A DefaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO GraceTime=20 "
    "Hidden=NO MaxNodes=UNLIMITED MaxTime=UNLIMITED MinNodes=0 LLN=NO "
    "MaxCPUsPerNode=UNLIMITED Nodes=localhost PriorityJobFactor=1 PriorityTier=1 RootOnly=NO "
    "ReqResv=NO OverSubscribe=NO OverTimeLimit=NONE PreemptMode=REQUEUE State=UP TotalCPUs=4 "
    "TotalNodes=1 SelectTypeParameters=NONE JobDefaults=(null) DefMemPerNode=UNLIMITED "
    "MaxMemPerNode=UNLIMITED\n"
)
PARTITION_NO_GRACE = PARTITION_BATCH.replace("GraceTime=20", "GraceTime=0")

END_AT = datetime(2026, 11, 29, 10, 15, 0).timestamp()


class FakeScontrol:
    """Answers `scontrol show job|partition` from canned text and records the calls."""

    def __init__(self, job: str | None = JOB_RUNNING, partition: str | None = PARTITION_BATCH):
        self.job, self.partition = job, partition
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str], timeout: float) -> str | None:
        assert timeout <= 5, "a slow slurmctld must not stall the start of training"
        self.calls.append(argv)
        return self.job if argv[2] == "job" else self.partition


def never_called(argv: list[str], timeout: float) -> str | None:
    raise AssertionError(f"scontrol must not be called: {argv}")


# --- parsers -----------------------------------------------------------------------------------


def test_a_job_record_keeps_values_with_equals_signs_spaces_and_odd_keys():
    record = parse_scontrol_record(JOB_RUNNING)
    assert record["JobId"] == "7" and record["Partition"] == "batch"
    assert record["TRES"] == "cpu=4,node=1,billing=4,gres/gpu=4"
    assert record["Comment"] == "ckpt save took 3s"
    assert record["AllocNode:Sid"] == "localhost:4242" and record["CPUs/Task"] == "4"
    assert record["Power"] == "" and record["TresPerNode"] == "gres:gpu:4"


def test_an_empty_record_parses_to_nothing():
    assert parse_scontrol_record("") == {}
    assert parse_scontrol_record("\n") == {}


def test_grace_time_is_read_from_the_partition():
    assert parse_grace_time(PARTITION_BATCH) == 20.0


@pytest.mark.parametrize(
    "text",
    [PARTITION_NO_GRACE, "PartitionName=x State=UP", "PartitionName=x GraceTime=abc"],
    ids=["zero", "absent", "garbage"],
)
def test_no_usable_grace_time_is_none(text):
    assert parse_grace_time(text) is None


def test_end_time_is_local_time_without_a_zone():
    assert parse_end_time(JOB_RUNNING) == END_AT


def test_an_unknown_end_time_is_none():
    assert parse_end_time(JOB_UNLIMITED) is None
    assert parse_end_time("JobId=1") is None


@pytest.mark.parametrize(
    "spec, seconds",
    [
        ("B:USR1@120", 120.0),
        ("USR1@90", 90.0),
        ("SIGUSR1@5", 5.0),
        ("R:10@30", 30.0),
        ("B:USR1", 60.0),
        ("USR2", 60.0),
        ("FOO@5", None),
        ("B:USR1@soon", None),
        ("", None),
    ],
)
def test_signal_specs_give_their_lead_time(spec, seconds):
    assert parse_signal_spec(spec) == seconds


# --- precedence --------------------------------------------------------------------------------


def test_preemptible_grace_seconds_beats_slurm_and_kubernetes():
    env = {
        "PREEMPTIBLE_GRACE_SECONDS": "42.5",
        "SLURM_JOB_ID": "7",
        "PREEMPTIBLE_POD_GRACE_SECONDS": "30",
    }
    grace = discover_grace(env, runner=never_called)
    assert grace == Grace(seconds=42.5, source="PREEMPTIBLE_GRACE_SECONDS")


def test_slurm_takes_the_shorter_of_grace_time_and_signal_lead_time():
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_PARTITION": "batch", "SBATCH_SIGNAL": "B:USR1@300"}
    scontrol = FakeScontrol()
    grace = discover_grace(env, runner=scontrol)
    assert grace == Grace(seconds=20.0, source="slurm", not_after=END_AT)
    assert scontrol.calls == [
        ["scontrol", "show", "job", "-o", "7"],
        ["scontrol", "show", "partition", "-o", "batch"],
    ]


def test_the_users_signal_mirror_beats_sbatch_signal_and_may_be_shorter_than_grace():
    env = {
        "SLURM_JOB_ID": "7",
        "PREEMPTIBLE_SLURM_SIGNAL_SECONDS": "B:USR1@10",
        "SBATCH_SIGNAL": "B:USR1@300",
    }
    grace = discover_grace(env, runner=FakeScontrol())
    assert grace.seconds == 10.0 and grace.source == "slurm"


def test_the_partition_comes_from_the_job_record_when_the_variable_is_missing():
    scontrol = FakeScontrol()
    assert discover_grace({"SLURM_JOB_ID": "7"}, runner=scontrol).seconds == 20.0
    assert scontrol.calls[1][-1] == "batch"


def test_without_scontrol_the_signal_mirror_still_counts():
    env = {"SLURM_JOB_ID": "7", "PREEMPTIBLE_SLURM_SIGNAL_SECONDS": "120"}
    grace = discover_grace(env, runner=FakeScontrol(job=None, partition=None))
    assert grace == Grace(seconds=120.0, source="slurm")


def test_slurm_without_any_answer_falls_through_to_kubernetes_then_unknown():
    missing = FakeScontrol(job=None, partition=None)
    env = {"SLURM_JOB_ID": "7", "PREEMPTIBLE_POD_GRACE_SECONDS": "30"}
    assert discover_grace(env, runner=missing) == Grace(seconds=30.0, source="kubernetes")
    assert discover_grace({"SLURM_JOB_ID": "7"}, runner=missing) == Grace(
        seconds=None, source="unknown"
    )


def test_a_job_without_grace_time_or_signal_still_gets_its_end_time():
    grace = discover_grace({"SLURM_JOB_ID": "7"}, runner=FakeScontrol(partition=PARTITION_NO_GRACE))
    assert grace == Grace(seconds=None, source="slurm", not_after=END_AT)


def test_kubernetes_pod_grace_is_used_outside_slurm():
    grace = discover_grace({"PREEMPTIBLE_POD_GRACE_SECONDS": "30"}, runner=never_called)
    assert grace == Grace(seconds=30.0, source="kubernetes")


def test_nothing_known_is_unknown():
    assert discover_grace({}, runner=never_called) == Grace(seconds=None, source="unknown")


@pytest.mark.parametrize(
    "name",
    [
        "PREEMPTIBLE_GRACE_SECONDS",
        "PREEMPTIBLE_POD_GRACE_SECONDS",
        "PREEMPTIBLE_SLURM_SIGNAL_SECONDS",
    ],
)
@pytest.mark.parametrize("value", ["soon", "-5", "inf", "nan"])
def test_a_bad_value_is_a_config_error_naming_the_variable(name, value):
    env = {name: value, "SLURM_JOB_ID": "7"}
    with pytest.raises(ConfigError, match=name):
        discover_grace(env, runner=FakeScontrol())


def test_an_empty_variable_counts_as_unset():
    assert discover_grace({"PREEMPTIBLE_GRACE_SECONDS": " "}, runner=never_called).source == (
        "unknown"
    )


# --- running scontrol --------------------------------------------------------------------------


def test_a_missing_scontrol_binary_means_unknown_not_a_crash(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    assert _run(["scontrol", "show", "job", "-o", "1"], 1.0) is None
    assert discover_grace({"SLURM_JOB_ID": "1"}).source == "unknown"


def test_a_failing_or_hanging_command_means_unknown():
    assert _run(["false"], 1.0) is None
    assert _run(["sleep", "5"], 0.2) is None
    assert _run(["echo", "GraceTime=5"], 1.0) == "GraceTime=5\n"


# --- the grace check ---------------------------------------------------------------------------


def test_a_short_slurm_grace_time_names_the_partition_setting_and_both_numbers():
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_PARTITION": "batch", "SBATCH_SIGNAL": "B:USR1@300"}
    grace = discover_grace(env, runner=FakeScontrol())
    warning = GraceCheck()(grace, 30.2, measured="p95 of 4 saves")
    assert warning is not None
    assert "20 s" in warning and "30.2 s (p95 of 4 saves)" in warning
    assert "GraceTime=46 on partition batch" in warning
    assert "scontrol update PartitionName=batch GraceTime=46" in warning


def test_a_short_signal_lead_time_names_the_sbatch_option():
    env = {"SLURM_JOB_ID": "7", "SBATCH_SIGNAL": "B:USR1@10"}
    grace = discover_grace(env, runner=FakeScontrol())
    warning = GraceCheck(safety=2)(grace, 8.0, measured="p95 of 3 saves")
    assert warning is not None and "--signal=B:USR1@16" in warning and "SBATCH_SIGNAL" in warning


def test_a_short_pod_grace_names_termination_grace_period_seconds():
    grace = discover_grace({"PREEMPTIBLE_POD_GRACE_SECONDS": "30"}, runner=never_called)
    warning = GraceCheck()(grace, 25.0, measured="p95 of 2 saves")
    assert warning is not None and "terminationGracePeriodSeconds: 38" in warning


def test_the_grace_check_warns_once_per_problem_and_again_when_it_grows():
    check = GraceCheck()
    grace = Grace(seconds=10.0, source="argument", fix="grace_seconds={n}")
    assert check(grace, 5.0, measured="x") is None  # 7.5 s wanted: enough
    assert check(grace, 10.0, measured="x") is not None
    assert check(grace, 10.5, measured="x") is None  # the same problem, a little worse
    assert check(grace, 14.0, measured="x") is not None  # wanted grew by more than a quarter
    assert check(Grace(seconds=12.0, source="argument"), 14.0, measured="x") is not None
    assert check(Grace(seconds=None, source="unknown"), 100.0, measured="x") is None


def test_the_safety_factor_must_be_at_least_one():
    with pytest.raises(ConfigError, match="safety"):
        GraceCheck(safety=0.5)
