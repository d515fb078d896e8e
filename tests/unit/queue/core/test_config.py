import pytest

from preemptible.errors import ConfigError
from preemptible.queue.core import parse_config_text, parse_duration

GOOD = """
[cluster]
gpus = 16
nodes = 2
gpus_per_node = 8
[policy]
fair_share_half_life = "7d"
aging = "1h"
starvation_limit = "3d"
backfill = false
defragment = false
beyond_limit = false
[preemption]
grace_safety = 2.0
grace_margin = "5s"
grace_min = "20s"
grace_max = "5m"
min_runtime = "10m"
min_runtime_multiple = 4
max_claimed_save = "4m"
max_claimed_restore = "20m"
min_runtime_max = "2h"
cooldown = "15m"
tier_patience = "5m"
reclaim_within = "20m"
queue_budget_per_hour = 3
[[queues]]
name = "team-a"
weight = 2.0
nominal = { gpus = 8 }
borrowing_limit = { gpus = 4 }
token = "env:TEAM_A_TOKEN"
run_as = "alice"
[[queues]]
name = "team-b"
nominal = { gpus = 8, cpus = 16 }
"""


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30),
        ("5m", 300),
        ("2h", 7200),
        ("7d", 604800),
        ("1w", 604800),
        ("250ms", 0.25),
        (45, 45),
        ("1.5h", 5400),
    ],
    ids=lambda v: str(v),
)
def test_durations_parse_to_seconds(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "5 minutes", "-3s", "abc", True, float("inf"), float("nan")])
def test_bad_durations_are_rejected(text):
    with pytest.raises(ConfigError):
        parse_duration(text)


def test_full_config_parses_every_key():
    cfg = parse_config_text(GOOD)
    assert cfg.cluster.gpus == 16 and cfg.cluster.nodes == 2 and cfg.cluster.gpus_per_node == 8
    assert cfg.policy.fair_share_half_life_s == 7 * 86400
    assert cfg.policy.aging_s == 3600 and cfg.policy.backfill is False
    assert cfg.policy.defragment is False and cfg.policy.beyond_limit is False
    assert cfg.policy.starvation_limit_s == 3 * 86400
    p = cfg.preemption
    assert (p.grace_safety, p.grace_margin_s, p.grace_min_s, p.grace_max_s) == (2.0, 5, 20, 300)
    assert (p.min_runtime_s, p.min_runtime_multiple, p.cooldown_s) == (600, 4, 900)
    assert p.tier_patience_s == 300
    assert (p.max_claimed_save_s, p.max_claimed_restore_s, p.min_runtime_max_s) == (240, 1200, 7200)
    assert (p.claimed_save_cap_s, p.claimed_restore_cap_s, p.min_runtime_cap_s) == (240, 1200, 7200)
    assert p.reclaim_within_s == p.guarantee_s == 1200
    assert p.queue_budget_per_hour == 3
    a = cfg.queue("team-a")
    assert a.weight == 2.0 and a.nominal.gpus == 8 and a.borrowing_limit.gpus == 4
    assert cfg.tokens == {"team-a": "env:TEAM_A_TOKEN"}
    assert cfg.run_as == {"team-a": "alice"}  # looked up by the queue manager, not here
    b = cfg.queue("team-b")
    assert b.nominal.cpus == 16 and b.borrowing_limit.gpus == float("inf")


def test_auto_gpus_is_left_to_the_shell():
    cfg = parse_config_text('[cluster]\ngpus = "auto"\n')
    assert cfg.gpus_auto and cfg.cluster.gpus == 0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[cluster]\ngpus = 8\n[policy]\nagin = '1h'\n", "unknown key 'agin'"),
        ("[cluster]\ngpus = 8\n[policy]\naging = 'soon'\n", "policy.aging"),
        (
            "[cluster]\ngpus = 8\n[policy]\nstarvation_limit = -1\n",
            "policy.starvation_limit: must not be negative",
        ),
        ("[cluster]\ngpus = 8\n[policy]\nstarvation_limit = inf\n", "must be a finite duration"),
        ("[policy]\naging = '1h'\n", "[cluster] is missing"),
        ("[cluster]\ngpus = 8\nnodes = 3\ngpus_per_node = 8\n", "make them agree"),
        (
            "[cluster]\ngpus = 8\n[[queues]]\nname='a'\nnominal={gpus=6}\n[[queues]]\nname='b'\n"
            "nominal={gpus=6}\n",
            "nominal quotas add up to 12",
        ),
        ("[cluster]\ngpus = 8\n[[queues]]\nname='a'\n[[queues]]\nname='a'\n", "used twice"),
        ("[cluster]\ngpus = 8\n[[queues]]\nname='a'\nweight=0\n", "greater than 0"),
        ("[cluster]\ngpus = 8\n[preemption]\ngrace_min='5m'\ngrace_max='1m'\n", "swap them"),
        (
            "[cluster]\ngpus = 8\n[preemption]\nreclaim_within='5m'\n",
            "reclaim_within \\(300s\\) is shorter than grace_max \\(600s, the default\\)",
        ),
        (
            "[cluster]\ngpus = 8\n[preemption]\nmin_runtime_max='1m'\n",
            "min_runtime_max \\(60s\\) is shorter than min_runtime \\(300s, the default\\)",
        ),
        (
            "[cluster]\ngpus = 8\n[preemption]\nmin_runtime='1h'\nmin_runtime_max='30m'\n",
            "preemption.min_runtime_max: min_runtime_max \\(1800s\\) is shorter than min_runtime "
            "\\(3600s\\): every job runs at least min_runtime",
        ),
        (
            "[cluster]\ngpus = 8\n[preemption]\nmax_claimed_restore=-300\n",
            "preemption.max_claimed_restore: must not be negative",
        ),
        (
            "[cluster]\ngpus = 8\n[preemption]\nmax_claimed_save='a while'\n",
            "preemption.max_claimed_save: 'a while' is not a duration",
        ),
        ("[cluster]\ngpus = 8\n[preemption]\nmax_claimed_save=inf\n", "finite duration"),
        ("[cluster]\ngpus = 8\n[preemption]\nmax_claim_save='5m'\n", "unknown key 'max_cl"),
        ("[cluster]\ngpus = 8\n[[queues]]\nname='a'\nnominal={gpu=2}\n", "unknown key 'gpu'"),
        ("[cluster\ngpus = 8\n", "not valid TOML"),
        ("[cluster]\ngpus = 8\n[policy]\ndefragment = 'yes'\n", "policy.defragment: expected true"),
        ("[cluster]\ngpus = 8\n[policy]\nbeyond_limit = 1\n", "policy.beyond_limit: expected true"),
    ],
    ids=[
        "typo",
        "bad-duration",
        "negative-limit",
        "infinite-limit",
        "no-cluster",
        "nodes-mismatch",
        "overcommitted",
        "duplicate",
        "zero-weight",
        "grace-swapped",
        "reclaim-within-below-grace",
        "min-runtime-max-below-default-min-runtime",
        "min-runtime-max-below-min-runtime",
        "negative-restore-cap",
        "save-cap-not-a-duration",
        "infinite-save-cap",
        "save-cap-typo",
        "resource-typo",
        "toml-syntax",
        "defragment-not-bool",
        "beyond-limit-not-bool",
    ],
)
def test_invalid_configs_name_the_problem(text, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        parse_config_text(text)


@pytest.mark.parametrize(
    "preemption, guarantee",
    [("", 1800), ("grace_max = '45m'", 8100), ("reclaim_within = '10m'", 600)],
)
def test_the_nominal_guarantee_is_three_graces_unless_set(preemption, guarantee):
    cfg = parse_config_text(f"[cluster]\ngpus = 8\n[preemption]\n{preemption}\n")
    assert cfg.preemption.guarantee_s == guarantee


@pytest.mark.parametrize(
    "preemption, caps",
    [
        ("", (600, 1800, 24000)),
        ("grace_max = '20m'", (1200, 3600, 48000)),
        ("max_claimed_restore = '5m'\nmin_runtime_multiple = 4", (600, 300, 3600)),
        ("min_runtime = '8h'", (600, 1800, 28800)),
        ("min_runtime_max = '1h'", (600, 1800, 3600)),
    ],
    ids=["defaults", "follow-grace-max", "restore-set", "floor-above-caps", "max-set"],
)
def test_claim_caps_follow_grace_max_unless_set(preemption, caps):
    p = parse_config_text(f"[cluster]\ngpus = 8\n[preemption]\n{preemption}\n").preemption
    assert (p.claimed_save_cap_s, p.claimed_restore_cap_s, p.min_runtime_cap_s) == caps


def test_unknown_queue_lookup_lists_known_queues():
    cfg = parse_config_text(GOOD)
    with pytest.raises(ConfigError, match="team-a, team-b"):
        cfg.queue("team-z")


def test_example_config_parses():
    from pathlib import Path

    text = (Path(__file__).parents[4] / "examples" / "queue.toml").read_text()
    cfg = parse_config_text(text)
    assert len(cfg.queues) >= 2


def test_the_service_tables_limits_parse_and_default():
    from preemptible.queue.core import ServiceSettings

    base = '[cluster]\ngpus = 1\n[[queues]]\nname = "a"\n'
    assert parse_config_text(base).service == ServiceSettings()
    text = base + (
        '[service]\nadmin_token = "env:X"\nrate = 2.5\nburst = 10\nmax_connections = 64\n'
        'keep_alive = "2s"\nbacklog = 16\nnotice_polls = 1\nin_flight = 2\n'
    )
    config = parse_config_text(text)
    assert config.admin_token == "env:X"
    assert config.service == ServiceSettings(
        rate_per_s=2.5,
        burst=10,
        max_connections=64,
        keep_alive_s=2.0,
        backlog=16,
        notice_polls=1,
        in_flight=2,
    )


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("rate = 0", "service.rate: must be more than 0"),
        ("burst = 0", "service.burst: must be at least 1"),
        ("max_connections = 1.5", "service.max_connections: expected a whole number"),
        ('keep_alive = "0s"', "service.keep_alive: must be longer than 0s"),
        ("notice_poll = 2", "unknown key 'notice_poll'"),
    ],
)
def test_bad_service_limits_name_the_key(line, message):
    text = f'[cluster]\ngpus = 1\n[[queues]]\nname = "a"\n[service]\n{line}\n'
    with pytest.raises(ConfigError, match=message):
        parse_config_text(text)
