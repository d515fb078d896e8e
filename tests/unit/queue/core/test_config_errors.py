"""Every configuration error names the file, the line and the key (tomllib gives no positions)."""

import pytest

from preemptible.errors import ConfigError
from preemptible.queue.core import parse_config, parse_config_text

CLUSTER = "[cluster]\ngpus = 8\n"  # lines 1-2 of most cases below


def two_queues(second: str) -> str:
    """Queue 'a' on lines 3-4, then `second` from line 5 ([[queues]] header included)."""
    return CLUSTER + "[[queues]]\nname = 'a'\n" + second


@pytest.mark.parametrize(
    ("text", "line", "key", "words"),
    [
        (CLUSTER + "\n[policy]\naging = '1h'\nagin = '1h'\n", 6, "policy.agin", "unknown key"),
        (CLUSTER + "[policy]\naging = 'soon'\n", 4, "policy.aging", "not a duration"),
        (CLUSTER + "[policy]\ndefragment = 'yes'\n", 4, "policy.defragment", "true or false"),
        (
            CLUSTER + "[preemption]\ngrace_min = '5m'\ngrace_max = '1m'\n",
            4,
            "preemption.grace_min",
            "swap them",
        ),
        (CLUSTER + "[preemption]\ngrace_max = '10s'\n", 4, "preemption.grace_max", "the default"),
        (
            CLUSTER + "[preemption]\nmin_runtime = '1h'\n\nmin_runtime_max = '10m'\n",
            6,
            "preemption.min_runtime_max",
            "set min_runtime_max to min_runtime or more",
        ),
        (
            CLUSTER + "[preemption]\nmax_claimed_restore = -1\n",
            4,
            "preemption.max_claimed_restore",
            "must not be negative",
        ),
        ("[cluster]\ngpus = 'eight'\n", 2, "cluster.gpus", "expected a number"),
        ("[cluster]\ngpus = 8\nnodes = 3\ngpus_per_node = 8\n", 3, "cluster.nodes", "agree"),
        ("[cluster]\ngpus = 8\ngpus_per_node = 8\n", 3, "cluster.gpus_per_node", "nodes` and"),
        (
            two_queues("[[queues]]\nname = 'b'\nnominal = { gpus = 2, cpus = -1 }\n"),
            7,
            "queues[1].nominal.cpus",
            "at least 0",
        ),
        (
            two_queues("[[queues]]\nname = 'b'\nnominal.gpus = 2\nnominal.gpu = 2\n"),
            8,
            "queues[1].nominal.gpu",
            "unknown key",
        ),
        (
            two_queues("[[queues]]\nname = 'b'\n[queues.borrowing_limit]\n\ngpus = 'all'\n"),
            9,
            "queues[1].borrowing_limit.gpus",
            "expected a number",
        ),
        (
            two_queues("[[queues]]\nname = 'b'\nweight = 0\n"),
            7,
            "queues[1].weight",
            "greater than 0",
        ),
        (two_queues("[[queues]]\nname = 'b'\ntoken = 5\n"), 7, "queues[1].token", "a string"),
        (two_queues("[[queues]]\nname = 'b'\nrun_as = '-x'\n"), 7, "queues[1].run_as", "Unix user"),
        (two_queues("\n[[queues]]\nname = 'a'\n"), 7, "queues[1].name", "used twice"),
        (
            two_queues("[[queues]]\nname = 'b'\nnominal = { gpus = 6 }\n").replace(
                "name = 'a'", "name = 'a'\nnominal = { gpus = 6 }"
            ),
            2,
            "cluster.gpus",
            "nominal quotas add up to 12",
        ),
        ("# a comment\nfoo = 1\n" + CLUSTER, 2, "foo", "unknown key 'foo'"),
        ('"quoted key" = 1\n' + CLUSTER, 1, '"quoted key"', "unknown key"),
        ("policy = 3\n" + CLUSTER, 1, "policy", "expected a table"),
        (
            CLUSTER.replace("\n", "\r\n") + "[policy]\r\naging = 'x'\r\n",
            4,
            "policy.aging",
            "duration",
        ),
    ],
    ids=[
        "unknown-key",
        "bad-duration",
        "not-a-switch",
        "grace-swapped",
        "grace-below-default-min",
        "min-runtime-max-below-min-runtime",
        "negative-restore-cap",
        "gpus-not-a-number",
        "nodes-disagree",
        "nodes-half-given",
        "inline-table",
        "dotted-key",
        "sub-table",
        "zero-weight",
        "token-not-a-string",
        "run-as-not-a-user-name",
        "duplicate-name",
        "overcommitted",
        "top-level-typo",
        "quoted-key",
        "table-not-a-table",
        "crlf-line-ends",
    ],
)
def test_errors_name_file_line_and_key(tmp_path, text, line, key, words):
    path = tmp_path / "queue.toml"
    path.write_bytes(text.encode())
    with pytest.raises(ConfigError) as info:
        parse_config_text(path.read_bytes().decode(), path=path)
    message = str(info.value)
    assert message.startswith(f"{path}:{line}: {key}: "), message
    assert words in message


@pytest.mark.parametrize(
    ("text", "line", "key"),
    [
        ("# capacity\n[cluster]\ncpus = 8\n", 2, "cluster.gpus"),
        (two_queues("\n# b\n[[queues]]\nweight = 2\n"), 7, "queues[1].name"),
    ],
    ids=["cluster-gpus", "queue-name"],
)
def test_a_missing_key_points_at_its_table_header(tmp_path, text, line, key):
    path = tmp_path / "queue.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match="missing") as info:
        parse_config_text(path.read_text(), path=path)
    assert str(info.value).startswith(f"{path}:{line}: {key}: ")


def test_a_missing_table_has_no_line_and_says_missing(tmp_path):
    path = tmp_path / "queue.toml"
    path.write_text("[policy]\naging = '1h'\n")
    with pytest.raises(ConfigError) as info:
        parse_config_text(path.read_text(), path=path)
    assert str(info.value).startswith(f"{path}: cluster: [cluster] is missing")


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        (CLUSTER + "[policy\n", 3, "Expected ']' at the end of a table declaration (column 8)"),
        (CLUSTER + "backfill = yes\n", 3, "Invalid value (column 12)"),
        (CLUSTER + 'name = """abc\n\n', 3, "Unterminated string at the end of the file"),
    ],
    ids=["table-header", "bad-value", "unclosed-string"],
)
def test_toml_syntax_errors_name_the_line(tmp_path, text, line, words):
    path = tmp_path / "queue.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        parse_config_text(path.read_text(), path=path)
    assert str(info.value) == f"{path}:{line}: the configuration is not valid TOML: {words}"


def test_a_key_inside_a_multi_line_array_is_placed_where_the_array_starts():
    text = "queues = [\n  { name = 'a' },\n  { name = 'b', weight = 0 },\n]\n" + CLUSTER
    with pytest.raises(ConfigError, match=r"^line 1: queues\[1\]\.weight: must be greater"):
        parse_config_text(text)


def test_text_without_a_path_names_the_line():
    with pytest.raises(ConfigError, match=r"^line 4: policy\.agin: unknown key"):
        parse_config_text(CLUSTER + "[policy]\nagin = '1h'\n")


def test_a_loaded_dict_names_the_key_and_no_line():
    data = {"cluster": {"gpus": 8}, "queues": [{"name": "a"}, {"name": "b", "weight": -1}]}
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    assert str(info.value) == "queues[1].weight: must be at least 0, got -1"
