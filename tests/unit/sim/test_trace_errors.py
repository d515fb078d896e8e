"""Every trace error about a row names the file, the line (header = line 1) and the column."""

import pytest

from preemptible.errors import ConfigError, TraceFormatError
from preemptible.sim.importers import import_trace
from preemptible.sim.trace import read_trace

HEADER = "job_id,submit_s,duration_s,gpus,queue,tier\n"
GOOD_ROW = "ok,0,10,1,a,normal\n"


@pytest.mark.parametrize(
    ("body", "line", "column", "words"),
    [
        ("1,0,ten,1,a,normal\n", 2, "duration_s", "'ten' is not a number"),
        (GOOD_ROW + "2,0,10,1.5,a,normal\n", 3, "gpus", "not a whole number"),
        (GOOD_ROW + "2,0,10,1,a,urgent\n", 3, "tier", "'urgent' is not one of critical"),
        (GOOD_ROW + "2,-5,10,1,a,normal\n", 3, "submit_s", "must be a number >= 0"),
        (GOOD_ROW + "2,0,10,1,,normal\n", 3, "queue", "is empty"),
        (GOOD_ROW + "2,0,10\n", 3, "queue", "is empty"),
        (GOOD_ROW + ",0,10,1,a,normal\n", 3, "job_id", "is empty"),
        (GOOD_ROW + "\n\n2,0,inf,1,a,normal\n", 5, "duration_s", "must be a number >= 0"),
        ('"multi\nline",0,10,1,a,normal\n2,0,x,1,a,normal\n', 4, "duration_s", "'x'"),
        (
            GOOD_ROW + "2,0,10,1,a,normal\n" + GOOD_ROW,
            4,
            "job_id",
            "'ok' appears twice (first on line 2)",
        ),
    ],
    ids=[
        "not-a-number",
        "fractional-gpus",
        "unknown-tier",
        "negative",
        "empty-queue",
        "short-row",
        "empty-id",
        "after-blank-lines",
        "after-a-multi-line-cell",
        "duplicate-id",
    ],
)
def test_bad_rows_name_file_line_and_column(tmp_path, body, line, column, words):
    assert_names_line_and_column(read_trace, tmp_path / "trace.csv", HEADER + body, line, column)
    assert words in str(_error(read_trace, tmp_path / "trace.csv"))


def assert_names_line_and_column(reader, path, text, line, column) -> None:
    """`reader` of a file holding `text` raises a TraceFormatError naming `path:line: column`."""
    path.write_text(text)
    message = str(_error(reader, path))
    assert message.startswith(f"{path}:{line}: column {column!r}"), message


def _error(reader, path) -> TraceFormatError:
    with pytest.raises(TraceFormatError) as info:
        reader(path)
    return info.value


def test_a_missing_column_names_the_header_line(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text("job_id,submit_s,duration_s,gpus,queue\n1,0,10,1,a\n")
    with pytest.raises(TraceFormatError, match=r"missing column 'tier' in the header \(line 1\)"):
        read_trace(path)


def test_malformed_csv_names_the_line(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_text(HEADER + GOOD_ROW + '2,0,10,1,a,"' + "x" * 200_000 + '"\n')
    with pytest.raises(TraceFormatError) as info:
        read_trace(path)
    assert str(info.value).startswith(f"{path}:3: not a valid CSV row: field larger")


CHRONUS = (
    "job_id,user,num_gpu,submit_time,iterations,model_name,duration,interval,"
    "expect_time_list,expect_value_list,best_effort,job_type\n"
)
PHILLY = "timestamp,duration,num_gpus,cluster\n"
ITP = "job_id,submission_time,duration,num_gpu\n"


@pytest.mark.parametrize(
    ("text", "line", "column", "words"),
    [
        (
            CHRONUS + "0,vc_x,2,10,1,m,30,1,40,10,0,strict\n1,vc_x,2,soon,1,m,30,1,40,10,0,best\n",
            3,
            "submit_time",
            "'soon' is not a number",
        ),
        (
            CHRONUS + "\n0,vc_x,two,10,1,m,30,1,40,10,0,strict\n",
            3,
            "num_gpu",
            "'two' is not a number",
        ),
        (
            PHILLY + "2017-10-03 10:00:00,60,1,a\nyesterday,60,1,a\n",
            3,
            "timestamp",
            "not an ISO date",
        ),
        (PHILLY + "2017-10-03 10:00:00,60,inf,a\n", 2, "num_gpus", "not a GPU count"),
        (ITP + "a,0,10,1\nb,5,10\n", 3, "num_gpu", "no value"),
    ],
    ids=[
        "chronus-time",
        "chronus-gpus",
        "philly-timestamp",
        "philly-infinite-gpus",
        "itp-short-row",
    ],
)
def test_import_errors_name_file_line_and_column(tmp_path, text, line, column, words):
    assert_names_line_and_column(import_trace, tmp_path / "public.csv", text, line, column)
    assert words in str(_error(import_trace, tmp_path / "public.csv"))


def test_an_unknown_layout_names_the_header_line(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(TraceFormatError) as info:
        import_trace(path)
    assert str(info.value).startswith(f"{path}:1: unknown trace layout")


def test_teams_out_of_range_is_a_config_error(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text(ITP + "a,0,10,1\n")
    with pytest.raises(ConfigError, match="teams must be between 1 and 10, not 11"):
        import_trace(path, teams=11)
