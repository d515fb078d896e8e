"""`preemptible queue`: run the queue manager, or talk to one over its HTTP API.

    preemptible queue serve --config queue.toml [--state DIR] [--host H] [--port N]
                            [--allow-jobs-as-root]
    preemptible queue submit --queue Q --gpus N [--tier T] [--estimate 2h] ... -- CMD...
    preemptible queue status|why|cancel|events|stats|logs ...
    preemptible queue export --to kueue|slurm queue.toml [-o DIR]
    preemptible queue doctor [--json]

The client commands read the address and token from `--url`/`--token` or
`PREEMPTIBLE_QUEUE_URL`/`PREEMPTIBLE_TOKEN` (prefer the variable: a `--token` shows in `ps`),
and print a table, or the server's JSON with `--json`. A refused request prints one line,
`error: <the server's message>`, and exits 2; an unreachable server exits 1 and names the URL.
"""

from __future__ import annotations

import fnmatch
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.table import Table

from preemptible._env_names import TOKEN_ENV, URL_ENV
from preemptible._units import fmt_duration
from preemptible.cli._common import (
    OnceCommand,
    OnceGroup,
    console,
    echo,
    echo_json,
    echo_raw,
    printable,
    require_extra,
    table,
)
from preemptible.cli._common import text as plain_text
from preemptible.cli._queue_arrays import expand as expand_ids
from preemptible.cli._queue_arrays import one_row_per_array, resolve_one
from preemptible.errors import PreemptibleError

if TYPE_CHECKING:
    import httpx  # imported when a client is made: 60 ms of every command's start otherwise

DEFAULT_PORT = 8470
DEFAULT_URL = f"http://127.0.0.1:{DEFAULT_PORT}"
ACTIVE_STATES = ("pending", "running", "preempting")

app = typer.Typer(
    help="Run the queue manager of one shared GPU machine, or talk to it.",
    no_args_is_help=True,
    cls=OnceGroup,
)

Url = Annotated[
    str,
    typer.Option("--url", envvar=URL_ENV, help="The queue manager's address.", show_envvar=True),
]
Token = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar=TOKEN_ENV,
        help="A queue token or the admin token (prefer the variable: a flag shows in ps).",
        show_envvar=True,
        show_default=False,
    ),
]
AsJson = Annotated[bool, typer.Option("--json", help="Print the server's JSON as it is.")]
JobId = Annotated[
    str,
    typer.Argument(help="The job's id (as `submit` and `status` show it), or an array's a7_3."),
]


def _fail(message: str, code: int = 2) -> NoReturn:
    echo(f"error: {' '.join(message.split())}", err=True)
    raise typer.Exit(code)


class _Client:
    """The few HTTP calls the commands make; every failure ends the command with one line."""

    def __init__(self, url: str, token: str | None, *, timeout_s: float = 30.0) -> None:
        if not url.startswith(("http://", "https://")):
            _fail(f"--url must start with http:// or https://, got {url!r}")
        self.url = url.rstrip("/")
        self.token = token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        import httpx

        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)

    def call(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        body: dict[str, Any] | None = None,
    ) -> Any:
        """The answer's JSON; exits 2 on a 4xx, 1 when the server cannot be reached."""
        return self.request(method, path, params=params, body=body).json()

    def try_call(
        self, method: str, path: str, *, body: dict[str, Any] | None = None
    ) -> tuple[Any, str | None]:
        """(the answer's JSON, None), or (None, why) on a 4xx: one of many calls that may
        fail on its own (a job already finished); exits 1 when the server cannot be reached
        or fails."""
        response = self._send(method, path, body=body)
        if 400 <= response.status_code < 500:
            return None, self._message(response)
        if response.status_code >= 500:
            _fail(self._message(response), code=1)
        return response.json(), None

    def job_id(self, given: str) -> str:
        """The job `given` names: its id, or "a7_3" (index 3 of array a7); exits 2 when it
        names no job."""
        try:
            found = resolve_one(self, given)
        except ValueError as exc:
            _fail(str(exc))
        if found is None:
            _fail(f"no job {given!r}: array {given.split('_')[0]} has no such index")
        return found

    def every_page(self, path: str, *, params: dict[str, Any] | None = None) -> list[Any]:
        """Every item of a listing: its pages, following `Link: <...>; rel="next"`."""
        items: list[Any] = []
        response = self.request("GET", path, params=params)
        while True:
            items += response.json()
            following = response.links.get("next", {}).get("url")
            if not following:
                return items
            response = self.request("GET", following)

    def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        body: dict[str, Any] | None = None,
    ) -> httpx.Response:
        """The answer; exits 2 on a 4xx, 1 when the server cannot be reached."""
        response = self._send(method, path, params=params, body=body)
        if response.status_code >= 400:
            _fail(self._message(response), code=2 if response.status_code < 500 else 1)
        return response

    def _send(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        body: dict[str, Any] | None = None,
    ) -> httpx.Response:
        """The answer, whatever its status; exits 1 when the server cannot be reached."""
        import httpx

        params = {k: v for k, v in (params or {}).items() if v is not None}
        try:
            return self._http.request(method, path, params=params or None, json=body)
        except httpx.TransportError as exc:
            _fail(
                f"cannot reach the queue manager at {self.url} ({exc.__class__.__name__}: {exc}); "
                f"is `preemptible queue serve` running there? Set --url or {URL_ENV}",
                code=1,
            )

    def _message(self, response: httpx.Response) -> str:
        try:
            message = str(response.json()["error"]["message"])
        except (ValueError, KeyError, TypeError):
            message = f"{response.status_code} {response.reason_phrase} from {self.url}"
        if response.status_code == 401 and not self.token:
            message += f" (no token given: pass --token or set {TOKEN_ENV})"
        return message


def _print_json(data: Any) -> None:
    echo_json(data, indent=2)


def _clock(at: float | None) -> str:
    return "-" if at is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


# --- serve ---------------------------------------------------------------------------------------


def _default_state_dir() -> Path:
    import platformdirs

    return Path(platformdirs.user_data_dir("preemptible")) / "queue"


@app.command(cls=OnceCommand)
def serve(
    config: Annotated[
        Path, typer.Option(help="Queue configuration (TOML).", exists=True, dir_okay=False)
    ],
    state: Annotated[
        Path | None,
        typer.Option(
            help="Folder for the state file and job logs \\[default: the user's data folder].",
            file_okay=False,
            show_default=False,
        ),
    ] = None,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.", min=1, max=65535)] = DEFAULT_PORT,
    allow_jobs_as_root: Annotated[
        bool,
        typer.Option(
            help="Run as root although a queue has no run_as: its jobs then run as root and can "
            "read every token (a machine nobody else uses; docs/user-guide/security.md)."
        ),
    ] = False,
    log_format: Annotated[
        str,
        typer.Option(
            help="plain: one line per decision (start, notice, checkpoint, requeue, restart...) "
            "with its reason; json: every line a JSON object, a decision's event under "
            '"decision".'
        ),
    ] = "plain",
) -> None:
    """Run the queue manager: schedule, launch and preempt jobs; serve the HTTP API and the
    dashboard (http://HOST:PORT/, signed in with a queue or the admin token)."""
    require_extra("queue", "queue serve")
    from preemptible.queue.service.decision_log import FORMATS
    from preemptible.queue.service.server import run_server

    if log_format not in FORMATS:
        _fail(f"--log-format must be plain or json, got {log_format!r}")

    if host not in ("127.0.0.1", "localhost", "::1"):
        echo(
            f"warning: listening on {host}: tokens cross the network in clear text unless a "
            "TLS proxy is in front",
            err=True,
        )
    try:
        where = state or _default_state_dir()
        run_server(
            config,
            where,
            host,
            port,
            allow_jobs_as_root=allow_jobs_as_root,
            log_format=log_format,
        )
    except PreemptibleError as exc:
        _fail(str(exc))
    except OSError as exc:
        _fail(f"cannot serve on {host}:{port}: {exc}", code=1)


# --- submit --------------------------------------------------------------------------------------


@app.command(context_settings={"allow_interspersed_args": False}, cls=OnceCommand)
def submit(
    command: Annotated[list[str], typer.Argument(help="The program and its arguments (after --).")],
    queue: Annotated[str, typer.Option(help="The queue (your team's).")],
    gpus: Annotated[
        int, typer.Option(help="GPUs to run on (an elastic job's largest size).", min=0)
    ] = 0,
    min_gpus: Annotated[
        int | None,
        typer.Option(
            help="Elastic: the fewest GPUs it may run on; the queue may start it smaller and "
            "shrink it instead of preempting it. `{gpus}` in the command is each attempt's size.",
            min=1,
            show_default=False,
        ),
    ] = None,
    gpus_multiple: Annotated[
        int, typer.Option(help="Elastic: its size is a multiple of this.", min=1)
    ] = 1,
    tier: Annotated[str, typer.Option(help="critical, high, normal or low.")] = "normal",
    cpus: Annotated[float, typer.Option(help="CPUs (0: not scheduled).", min=0)] = 0.0,
    memory_gb: Annotated[float, typer.Option(help="Memory in GB (0: not scheduled).", min=0)] = 0.0,
    gang: Annotated[
        bool | None,
        typer.Option(
            "--gang/--no-gang",
            help="All GPUs at once \\[default: yes for more than one GPU].",
            show_default=False,
        ),
    ] = None,
    estimate: Annotated[
        str | None, typer.Option(help="Expected runtime, e.g. 90m or 2h (helps backfill).")
    ] = None,
    name: Annotated[
        str | None, typer.Option(help="A name to show \\[default: the program].")
    ] = None,
    env: Annotated[
        list[str] | None, typer.Option(help="KEY=VALUE for the job's environment (repeatable).")
    ] = None,
    cwd: Annotated[
        Path | None,
        typer.Option(help="Working directory \\[default: this one].", show_default=False),
    ] = None,
    hold: Annotated[
        bool, typer.Option("--hold", help="Submit it held: it waits until `release`.")
    ] = False,
    after: Annotated[
        list[str] | None,
        typer.Option(
            help="Start after this job: ID or ID:ok (it succeeded), ID:any (it ended), "
            "ID:started; repeatable; an array's id (a7) for each of its jobs. One that cannot "
            "happen any more cancels this job.",
            show_default=False,
        ),
    ] = None,
    max_restarts: Annotated[
        int | None,
        typer.Option(
            help="Restarts after a crash or a hang, at most its queue's \\[default: the "
            "queue's, 3 unless configured].",
            min=0,
            show_default=False,
        ),
    ] = None,
    hang_after: Annotated[
        str | None,
        typer.Option(
            help="Restart it as hung when its step stands still this long, e.g. 30m "
            "\\[default: learned from its step times].",
            show_default=False,
        ),
    ] = None,
    array: Annotated[
        str | None,
        typer.Option(
            help="Submit an array, as sbatch: 0-99%8 is indices 0 to 99, at most 8 at once "
            "(also 1,3,10-20:2). Each job's index is in $PREEMPTIBLE_ARRAY_INDEX and `{index}` "
            "in the command; `a7` then names the array, `a7_3` its index 3.",
            show_default=False,
        ),
    ] = None,
    url: Url = DEFAULT_URL,
    token: Token = None,
    as_json: AsJson = False,
) -> None:
    """Submit a job: `submit --queue team-a --gpus 2 -- python train.py --lr 3e-4`.

    An elastic job takes a range: `submit --queue team-a --gpus 8 --min-gpus 4 -- torchrun
    --nproc-per-node {gpus} train.py` runs on 4 to 8 GPUs, the size of each attempt in
    `{gpus}` and in $PREEMPTIBLE_GPUS.
    """
    from preemptible.queue.core import parse_duration

    body: dict[str, Any] = {
        "queue": queue,
        "command": command,
        "gpus": gpus,
        "tier": tier,
        "cpus": cpus,
        "memory_gb": memory_gb,
        "env": _parse_env(env or []),
        "cwd": str((cwd or Path.cwd()).absolute()),
    }
    if gang is not None:
        body["gang"] = gang
    if min_gpus is not None:
        body["min_gpus"] = min_gpus
    if gpus_multiple != 1:
        body["gpus_multiple"] = gpus_multiple
    if name is not None:
        body["name"] = name
    if max_restarts is not None:
        body["max_restarts"] = max_restarts
    if hold:
        body["hold"] = True
    if after:
        body["after"] = list(after)
    if array is not None:
        body["array"] = array
    for option, value, key in (
        ("--estimate", estimate, "estimate_s"),
        ("--hang-after", hang_after, "hang_after_s"),
    ):
        if value is not None:
            try:
                body[key] = parse_duration(value, key=option)
            except PreemptibleError as exc:
                _fail(str(exc))
    client = _Client(url, token)
    job = client.call("POST", "/v1/jobs", body=body)
    if as_json:
        _print_json(job)
    elif job.get("array_id") is None:
        echo(f"submitted job {job['id']} to {job['queue']} ({job['state']})")
    else:
        jobs = client.every_page("/v1/jobs", params={"array": job["array_id"]})
        limit = job.get("array_limit")
        echo(
            f"submitted array {job['array_id']} to {job['queue']}: {len(jobs)} jobs, "
            f"{jobs[0]['id']} to {jobs[-1]['id']}" + (f", at most {limit} at once" if limit else "")
        )


def _size(job: dict[str, Any]) -> str:
    """GPUS: "8", or for an elastic job its size now and its range: "4 (4-8)"; an array's
    row: "1 each"."""
    gpus, low = job["gpus"], job.get("min_gpus")
    if "array_jobs" in job:
        return f"{gpus} each"
    if low is None or low >= gpus:
        return str(gpus)
    now = len(job.get("gpu_ids") or ()) or gpus
    return f"{now} ({low}-{gpus})" if job.get("gpu_ids") else f"{low}-{gpus}"


def _parse_env(pairs: list[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            _fail(f"--env expects KEY=VALUE, got {pair!r}")
        env[key] = value
    return env


# --- reading -------------------------------------------------------------------------------------


@app.command(cls=OnceCommand)
def status(
    queue: Annotated[str | None, typer.Option(help="Only this queue.")] = None,
    state: Annotated[
        str | None, typer.Option(help="Only this state (pending, running, completed...).")
    ] = None,
    show_all: Annotated[
        bool, typer.Option("--all", help="Finished jobs too (completed, failed, cancelled).")
    ] = False,
    watch: Annotated[
        bool,
        typer.Option(
            "--watch", "-w", help="Show it again every --interval until Ctrl-C, like watch(1)."
        ),
    ] = False,
    interval: Annotated[str, typer.Option(help="How often --watch asks.")] = "2s",
    expand: Annotated[
        bool,
        typer.Option(
            "--expand", help="Each job of an array on its own line (else one line an array)."
        ),
    ] = False,
    array: Annotated[
        str | None, typer.Option(help="Only this array's jobs (its id, a7), one line each.")
    ] = None,
    url: Url = DEFAULT_URL,
    token: Token = None,
    as_json: AsJson = False,
) -> None:
    """The jobs, like squeue: waiting and running ones unless --all or --state; an array on
    one line, with how many of its jobs are in each state, unless --expand."""
    pause_s = _duration(interval, "--interval")
    client = _Client(url, token)
    # Without --all, only the waiting and running jobs are asked for: not every finished job.
    states = [state] if state is not None or show_all or array else list(ACTIVE_STATES)
    expand = expand or as_json or array is not None

    def jobs() -> list[dict[str, Any]]:
        found = [
            job
            for one in states
            for job in client.every_page(
                "/v1/jobs", params={"queue": queue, "state": one, "array": array}
            )
        ]
        found.sort(key=lambda j: (j["submitted_at"], j["id"]))
        return found if expand else _arrays_in_one_row(client, found)

    if as_json and not watch:
        _print_json(jobs())
        return
    if not watch:
        _print_status(jobs(), console(width=_width()))
        return
    out = console(width=_width())
    try:
        while True:
            found = jobs()
            if as_json:
                echo_json(found)  # one list a line
            elif out.is_terminal:
                out.clear()
                out.print(f"every {interval}: {client.url}  {_clock(time.time())}")
                _print_status(found, out)
            else:  # a pipe or a file: each frame after the last, dated
                echo(f"--- {_clock(time.time())}")
                _print_status(found, out)
            time.sleep(pause_s)
    except KeyboardInterrupt:
        raise typer.Exit(0) from None


def _arrays_in_one_row(client: _Client, jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`jobs` with each array on one row, counting all its jobs (the finished ones too) when
    any of them is among `jobs`."""
    shown = dict.fromkeys(j["array_id"] for j in jobs if j.get("array_id") is not None)
    if not shown:
        return jobs
    every = {a: client.every_page("/v1/jobs", params={"array": a}) for a in shown}
    merged = [j for j in jobs if j.get("array_id") is None]
    merged += [members[0] | {"_all": members} for members in every.values() if members]
    merged.sort(key=lambda j: (j["submitted_at"], j["id"]))
    rows = []
    for job in merged:
        rows += one_row_per_array(job.pop("_all")) if "_all" in job else [job]
    return rows


def _print_status(jobs: list[dict[str, Any]], out: Any) -> None:
    """The status table of `jobs` (or "no jobs")."""
    if not jobs:
        out.print("no jobs")
        return
    jobs_table = table(box=None, header_style="bold", pad_edge=False)
    for column in ("ID", "NAME", "QUEUE", "TIER", "STATE", "GPUS", "WAITED", "REASON"):
        jobs_table.add_column(column, no_wrap=column != "REASON")
    now = time.time()
    for job in jobs:
        jobs_table.add_row(
            job["id"],
            job["name"],
            job["queue"],
            job["tier"],
            _state(job["state"]),
            _size(job),
            fmt_duration(_waited(job, now)),
            _reason(job["state"], job["reason"]),
        )
    out.print(jobs_table)


STATE_STYLES = {
    "running": "green",
    "pending": "yellow",
    "preempting": "magenta",
    "completed": "dim",
    "failed": "bold red",
    "cancelled": "dim",
}
"""Colours of the states on a terminal (none when NO_COLOR is set or output is not a tty)."""


def _state(state: str) -> Any:
    """The state, escaped as every cell, in its colour."""
    return plain_text(state, style=STATE_STYLES.get(state, ""))


def _reason(state: str, reason: str) -> str:
    """The reason without the state it starts with ("pending: waiting..." beside "pending")."""
    return reason.removeprefix(f"{state}: ")


def _waited(job: dict[str, Any], now: float) -> float:
    """Time in the queue: until now while pending, else until the (last) start."""
    end = now if job["state"] == "pending" else job["started_at"] or job["finished_at"] or now
    return max(0.0, float(end) - float(job["submitted_at"]))


def _width() -> int | None:
    return None if sys.stdout.isatty() else 160


@app.command(cls=OnceCommand)
def why(
    job_id: JobId, url: Url = DEFAULT_URL, token: Token = None, as_json: AsJson = False
) -> None:
    """Why a job waits, or why it was preempted: its state, reason, any claimed cost counted as
    less than claimed, and its history."""
    client = _Client(url, token)
    answer = client.call("GET", f"/v1/jobs/{client.job_id(job_id)}/why")
    if as_json:
        _print_json(answer)
        return
    echo(f"{answer['id']}: {answer['state']}: {_reason(answer['state'], answer['reason'])}")
    for clamp in answer.get("clamped") or ():  # a server older than the caps sends none
        echo(f"  {clamp}")
    for event in answer["history"]:
        echo(f"  {_clock(event['at'])}  {event['kind']:<12} {event['reason']}")
        tail = (event.get("data") or {}).get("tail") or ()
        if tail and event is _newest_failure(answer["history"]):
            echo("    its last output:")
            for line in tail:
                echo(f"    | {line}")


def _newest_failure(history: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The newest event that kept a failed attempt's output (`history` is newest first)."""
    return next((e for e in history if (e.get("data") or {}).get("tail")), None)


JobIds = Annotated[
    list[str] | None,
    typer.Argument(
        help="Job ids (as `submit` and `status` show them); an array's id (a7) for its jobs, "
        "a7_3 for its index 3.",
        show_default=False,
    ),
]
Team = Annotated[
    str | None, typer.Option("--queue", help="Every job of this queue that --state selects.")
]
Pattern = Annotated[
    str | None,
    typer.Option("--name", help="Only jobs whose name matches this shell pattern (exp-*)."),
]


@app.command(cls=OnceCommand)
def cancel(
    job_ids: JobIds = None,
    queue: Team = None,
    state: Annotated[
        str | None,
        typer.Option(help="Only jobs in this state (pending, running...) \\[default: active]."),
    ] = None,
    name: Pattern = None,
    url: Url = DEFAULT_URL,
    token: Token = None,
    as_json: AsJson = False,
) -> None:
    """Cancel jobs: by id (`cancel j7 j9`), or every active job that --queue, --state and
    --name select (`cancel --queue team-a --name 'sweep-*'`). A running job gets its notice
    and grace, then is killed; a pending one is gone at once."""
    _each(_Client(url, token), "DELETE", "", job_ids, queue, state, name, as_json)


@app.command(cls=OnceCommand)
def hold(
    job_ids: JobIds = None,
    queue: Team = None,
    name: Pattern = None,
    url: Url = DEFAULT_URL,
    token: Token = None,
    as_json: AsJson = False,
) -> None:
    """Keep pending jobs out of their queue until `release` (they keep their place)."""
    client = _Client(url, token)
    _each(client, "POST", "/hold", job_ids, queue, None, name, as_json, among=("pending",))


@app.command(cls=OnceCommand)
def release(
    job_ids: JobIds = None,
    queue: Team = None,
    name: Pattern = None,
    url: Url = DEFAULT_URL,
    token: Token = None,
    as_json: AsJson = False,
) -> None:
    """Put held jobs back in their queue."""
    client = _Client(url, token)
    pending = ("pending",)
    _each(client, "POST", "/release", job_ids, queue, None, name, as_json, among=pending, held=True)


@app.command(cls=OnceCommand)
def priority(
    tier: Annotated[str, typer.Argument(help="The new tier: critical, high, normal or low.")],
    job_ids: JobIds = None,
    queue: Team = None,
    name: Pattern = None,
    url: Url = DEFAULT_URL,
    token: Token = None,
    as_json: AsJson = False,
) -> None:
    """Move pending jobs to another tier: `priority high j7 a9` (a9: every pending job of
    array a9). They keep their place by submission time; a running job keeps its tier."""
    client = _Client(url, token)
    body = {"tier": tier}
    _each(
        client,
        "POST",
        "/priority",
        job_ids,
        queue,
        None,
        name,
        as_json,
        among=("pending",),
        body=body,
    )


def _each(
    client: _Client,
    method: str,
    suffix: str,
    job_ids: list[str] | None,
    queue: str | None,
    state: str | None,
    name: str | None,
    as_json: bool,
    *,
    held: bool = False,
    among: tuple[str, ...] = ACTIVE_STATES,
    body: dict[str, Any] | None = None,
) -> None:
    """Do `method /v1/jobs/{id}{suffix}` for the ids given, or for the jobs the filters
    select (in the states `among`, else `state`; only held ones with `held`); a line per job,
    and exit 2 if any was refused (the others are still done)."""
    if job_ids and (queue or name or state):
        _fail("give job ids, or --queue/--state/--name to select jobs, not both")
    if not job_ids and not (queue or name):
        _fail("give job ids, or --queue and/or --name to select the jobs")
    ids, problems = expand_ids(client, list(job_ids or ()), among if state is None else (state,))
    for unknown in problems:
        echo(f"error: {unknown}", err=True)
    if job_ids and not ids:
        raise typer.Exit(2 if problems else 0)
    if not ids:
        states = [state] if state else list(among)
        for one in states:
            for job in client.every_page("/v1/jobs", params={"queue": queue, "state": one}):
                if (name is None or fnmatch.fnmatchcase(job["name"], name)) and (
                    not held or job.get("held")
                ):
                    ids.append(job["id"])
        if not ids:
            echo("no job matches")
            return
    answers, refused = [], len(problems)
    for job_id in ids:
        answer, problem = client.try_call(method, f"/v1/jobs/{job_id}{suffix}", body=body)
        if problem is not None:
            refused += 1
            echo(f"error: {job_id}: {problem}", err=True)
            continue
        answers.append(answer)
        if not as_json:
            echo(f"{answer['id']}: {answer['state']} ({answer['reason']})")
    if as_json:  # one id asked for: its job, as before there were many
        _print_json(answers[0] if job_ids and len(ids) == 1 and answers else answers)
    if refused:
        raise typer.Exit(2)


@app.command(cls=OnceCommand)
def events(
    since: Annotated[int, typer.Option(help="Only events after this id.", min=0)] = 0,
    queue: Annotated[str | None, typer.Option(help="Only this queue's events.")] = None,
    job: Annotated[str | None, typer.Option(help="Only this job's events.")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new ones.")] = False,
    interval: Annotated[str, typer.Option(help="How often --follow asks.")] = "1s",
    url: Url = DEFAULT_URL,
    token: Token = None,
    as_json: AsJson = False,
) -> None:
    """The audit log: submitted, admitted, notice, exited, requeued, cancelled, with reasons
    and who asked (the admin, queue:NAME or job:ID; - for the manager's own decisions)."""
    pause_s = _duration(interval, "--interval")
    client = _Client(url, token)
    params: dict[str, Any] = {"since": since, "queue": queue, "job_id": job}
    if as_json and not follow:
        _print_json(client.every_page("/v1/events", params=params))
        return
    try:
        while True:
            response = client.request("GET", "/v1/events", params=params)
            found = response.json()
            for event in found:
                if as_json:
                    echo_json(event)  # one object a line while following
                else:
                    echo(_event_line(event))
            if found:
                params["since"] = found[-1]["id"]
            if "next" in response.links:
                continue  # a full page: the next one at once
            if not follow:
                return
            if not found:
                time.sleep(pause_s)
    except KeyboardInterrupt:
        raise typer.Exit(0) from None


def _event_line(event: dict[str, Any]) -> str:
    return (
        f"{event['id']:>6}  {_clock(event['at'])}  {event['kind']:<12} "
        f"{event['job_id'] or '-':<8} {event['queue'] or '-':<12} {_who(event.get('by')):<16} "
        f"{event['reason']}"
    )


def _who(by: dict[str, Any] | None) -> str:
    """Who asked for an event: `admin`, `queue:NAME` or `job:ID` (the token used); `-` for the
    manager's own decisions."""
    if not by:
        return "-"
    return "admin" if by.get("kind") == "admin" else f"{by.get('kind')}:{by.get('name')}"


def _duration(text: str, option: str) -> float:
    from preemptible.queue.core import parse_duration

    try:
        return parse_duration(text, key=option)
    except PreemptibleError as exc:
        _fail(str(exc))


@app.command(cls=OnceCommand)
def stats(url: Url = DEFAULT_URL, token: Token = None, as_json: AsJson = False) -> None:
    """The four signals per queue and overall: wait, utilisation, preemptions, least served."""
    answer = _Client(url, token).call("GET", "/v1/stats")
    if as_json:
        _print_json(answer)
        return
    console(width=_width()).print(signals_table(answer))
    echo(
        f"max wait of the least-served queue: {fmt_duration(answer['max_wait_least_served_s'])}"
        f" (window {fmt_duration(answer['window_s'])})"
    )


def signals_table(stats: dict[str, Any]) -> Table:
    """The four signals of a `/v1/stats` answer, one row per queue and one overall."""
    signals = table(box=None, header_style="bold", pad_edge=False)
    columns = ("QUEUE", "JOBS", "P95 WAIT", "MAX WAIT", "UTIL", "GOODPUT", "PREEMPTED")
    rows = [*sorted(stats["queues"].items()), ("(overall)", stats["overall"])]
    for column in (*columns, "LOST EACH"):  # fits 80 columns
        signals.add_column(column, justify="left" if column == "QUEUE" else "right")
    for name, s in rows:
        signals.add_row(
            name,
            str(s["jobs"]),
            fmt_duration(s["p95_wait_s"]),
            fmt_duration(s["max_wait_s"]),
            f"{100 * s['utilization']:.1f}%",
            f"{100 * s['goodput']:.1f}%",
            f"{s['preemptions']} ({s['preemptions_per_hour']:.3g}/h)",
            f"{s['lost_gpu_s_per_preemption']:.1f} GPU-s",
        )
    resized = [(name, s) for name, s in sorted(stats["queues"].items()) if s.get("resizes")]
    if resized:  # elastic jobs' shrinks and grows are not preemptions: counted apart
        each = ", ".join(
            f"{name} {s['resizes']} ({s['resize_lost_gpu_s']:.1f} GPU-s)" for name, s in resized
        )
        signals.caption = plain_text(f"resized, apart from preemptions: {each}")  # never markup
        signals.caption_justify = "left"
    return signals


@app.command(cls=OnceCommand)
def logs(
    job_id: JobId,
    attempt: Annotated[
        int | None, typer.Option(help="Which attempt \\[default: the latest].")
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing until the job finishes.")
    ] = False,
    interval: Annotated[str, typer.Option(help="How often --follow asks.")] = "1s",
    raw: Annotated[
        bool,
        typer.Option(
            "--raw",
            help="Print the output as the job wrote it, control characters and all (colours, "
            "progress bars): only for a job you trust. By default each control character but "
            "newline and tab is shown escaped, like \\x1b.",
        ),
    ] = False,
    url: Url = DEFAULT_URL,
    token: Token = None,
    as_json: AsJson = False,
) -> None:
    """A job's output (stdout and stderr of one attempt), its control characters escaped
    unless --raw."""
    pause_s = _duration(interval, "--interval")
    client = _Client(url, token)
    job_id = client.job_id(job_id)
    offset = 0
    try:
        while True:
            chunk = client.call(
                "GET",
                f"/v1/jobs/{job_id}/logs",
                params={"attempt": attempt, "offset": offset},
            )
            if as_json:
                echo_json(chunk)
            elif chunk["text"]:
                echo_raw(chunk["text"] if raw else printable(chunk["text"], lines=True))
            caught_up = chunk["next_offset"] == offset
            offset = chunk["next_offset"]
            if caught_up and (not follow or chunk["state"] not in ACTIVE_STATES):
                return
            if caught_up:
                time.sleep(pause_s)
    except KeyboardInterrupt:
        raise typer.Exit(0) from None


# --- doctor --------------------------------------------------------------------------------------


_DOCTOR_HELP = (
    "Say how the queue manager keeps each job's processes together on this machine, and why.\n\n"
    "Every process a job starts is the job's until it exits: a process that calls setsid (any "
    "launcher that daemonises does) leaves the job's process group, and would otherwise miss "
    "the notice and the kill and keep its GPU after the job has ended. The manager chooses, "
    "once when it starts, the first of these that works here:\n\n"
    "cgroup v2, cgroup v1 freezer, cgroup v1 pids: each attempt gets a cgroup of its own "
    "(<hierarchy>/preemptible/<job>-<attempt>-<random>); every process of the job is listed "
    "there whatever it does, is frozen and signalled with the rest, and the job's GPUs go to "
    "another job only once the cgroup is empty. Needs root, or a hierarchy delegated to the "
    "manager's user.\n\n"
    "child subreaper: the job's runner adopts the job's orphans (prctl PR_SET_CHILD_SUBREAPER), "
    "so a process that escapes by double-fork and setsid is still the runner's descendant and "
    "still gets the notice and the kill; only one that kills the runner itself gets away.\n\n"
    "process group: the last resort; a process that calls setsid escapes.\n\n"
    "Run it as the user the manager runs as: what works depends on it. Exit status 0 when jobs "
    "are contained (a cgroup or the subreaper), 1 when only the process group is left. See "
    "docs/user-guide/queue-manager.md#how-a-job-is-contained."
)


@app.command(help=_DOCTOR_HELP, cls=OnceCommand)
def doctor(
    as_json: Annotated[bool, typer.Option("--json", help="Print the findings as JSON.")] = False,
) -> None:
    """Say how jobs are contained on this machine (help: `_DOCTOR_HELP`)."""
    require_extra("queue", "queue doctor")  # what the manager would use, where it would run
    from preemptible.queue.service.containment import Mechanism, survey

    found = survey()
    chosen = next(each for each in found if each.available)
    if as_json:
        _print_json(
            {
                "in_force": chosen.mechanism.value,
                "why": chosen.why,
                "mechanisms": [
                    {
                        "mechanism": each.mechanism.value,
                        "available": each.available,
                        "cgroup_root": each.cgroup_root,
                        "why": each.why,
                    }
                    for each in found
                ],
            }
        )
    else:
        echo(f"in force: {chosen.why}")
        echo("on this machine:")
        for each in found:
            if each is chosen:
                state = "in force"
            elif each.available:
                state = "available"
            else:
                state = f"not available: {each.why}"
            where = f" ({each.cgroup_root})" if each.cgroup_root else ""
            echo(f"  {each.mechanism}{where}: {state}")
    raise typer.Exit(1 if chosen.mechanism is Mechanism.PROCESS_GROUP else 0)


# --- export --------------------------------------------------------------------------------------


_EXPORT_HELP = (
    "Turn a queue config into the policy of Kueue or SLURM.\n\n"
    "kueue writes kueue.yaml: a ResourceFlavor, a Cohort, a ClusterQueue per queue (nominal "
    "quota, borrowing limit, fair-sharing weight, preemption), a Namespace and a LocalQueue "
    "per queue, and a WorkloadPriorityClass per tier (label jobs with "
    "kueue.x-k8s.io/priority-class).\n\n"
    "slurm writes slurm.conf, a fragment to append to a slurm.conf that defines the nodes (a "
    "partition per tier, preemption with requeue, GraceTime, fair-share priority), and "
    "sacctmgr.sh (an account per queue with its fair share and caps; needs slurmdbd).\n\n"
    "Each file starts with comments on what the scheduler cannot express. Without -o the "
    "files are printed. See docs/user-guide/schedulers.md."
)


@app.command("export", help=_EXPORT_HELP, cls=OnceCommand)
def export_policy(
    config: Annotated[Path, typer.Argument(help="Queue configuration (TOML).", show_default=False)],
    to: Annotated[
        str,
        typer.Option(
            "--to",
            help="kueue: one YAML of Kueue objects. slurm: a slurm.conf fragment and a "
            "sacctmgr script.",
            show_default=False,
        ),
    ],
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            help="Write the files into this folder (made if missing) \\[default: print them].",
            file_okay=False,
            show_default=False,
        ),
    ] = None,
    namespace: Annotated[
        str | None,
        typer.Option(
            help="kueue: the namespace of every LocalQueue \\[default: one per queue, named "
            "after it].",
            show_default=False,
        ),
    ] = None,
    cohort: Annotated[
        str | None,
        typer.Option(help="kueue: the Cohort's name \\[default: preemptible].", show_default=False),
    ] = None,
    kueue_api: Annotated[
        str | None,
        typer.Option(help="kueue: v1beta2 or v1beta1 \\[default: v1beta2].", show_default=False),
    ] = None,
) -> None:
    """Turn a queue config into the policy of Kueue or SLURM (help: `_EXPORT_HELP`)."""
    from preemptible.queue.core import parse_config_text
    from preemptible.queue.export import export_files

    kueue_options = {"namespace": namespace, "cohort": cohort, "api_version": kueue_api}
    options = {key: value for key, value in kueue_options.items() if value is not None}
    if to != "kueue" and options:
        _fail("--namespace, --cohort and --kueue-api apply to --to kueue only")
    if to == "kueue":
        require_extra("k8s", "queue export --to kueue", modules=("yaml",))  # YAML, no client
    try:
        text = config.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        _fail(f"cannot read {config}: {exc}")
    try:
        files = export_files(parse_config_text(text, path=config), to, **options)
    except PreemptibleError as exc:
        _fail(str(exc))
    if output is None:
        for name, content in files.items():
            if len(files) > 1:
                echo(f"# ==> {name} <==")
            echo_raw(content)  # files in a format (YAML, slurm.conf) made of validated names
        return
    try:
        output.mkdir(parents=True, exist_ok=True)
        for name, content in files.items():
            _write_file(output / name, content, executable=name.endswith(".sh"))
    except OSError as exc:
        _fail(f"cannot write to {output}: {exc}", code=1)
    for name in files:
        echo(f"wrote {output / name}")


def _write_file(path: Path, content: str, *, executable: bool) -> None:
    """Write `content` to a temporary file beside `path`, then replace `path` with it."""
    temp = path.with_name(f".{path.name}.tmp")
    temp.write_text(content, encoding="utf-8")
    temp.chmod(0o755 if executable else 0o644)
    temp.replace(path)


__all__ = ["app"]
