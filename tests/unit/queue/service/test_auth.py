"""Tokens: resolved from the configuration, compared in constant time, never shown."""

from __future__ import annotations

import hmac
import logging
from types import SimpleNamespace

import pytest

from preemptible.errors import ConfigError
from preemptible.queue.core import parse_config_text
from preemptible.queue.service.auth import (
    AuthenticationError,
    Authenticator,
    Tokens,
    bearer_token,
    resolve_tokens,
)
from preemptible.queue.service.views import JobState, Principal, PrincipalKind, TokenOwner

from .fake_manager import (
    ADMIN_TOKEN,
    CONFIG_TEXT,
    ENVIRON,
    TEAM_A_TOKEN,
    TEAM_B_TOKEN,
    make_config,
)


def specs(admin: str | None = None, **queues: str) -> SimpleNamespace:
    """A configuration as resolve_tokens reads it (`admin_token` from the [service] table)."""
    return SimpleNamespace(tokens=queues, admin_token=admin)


def test_env_specs_are_read_from_the_environment_and_others_taken_literally() -> None:
    tokens = resolve_tokens(
        specs(admin="env:ADMIN", a="env:A", b="literal-b-token"),
        {"ADMIN": "admin-secret", "A": "a-secret"},
    )
    assert tokens.admin == "admin-secret"
    assert dict(tokens.queues) == {"a": "a-secret", "b": "literal-b-token"}


def test_a_parsed_config_gives_the_queue_tokens_and_the_service_tables_admin_token() -> None:
    tokens = resolve_tokens(make_config(), ENVIRON)
    assert tokens.admin == ADMIN_TOKEN
    assert dict(tokens.queues) == {"team-a": TEAM_A_TOKEN, "team-b": TEAM_B_TOKEN}


def test_a_config_without_a_service_table_has_no_admin_token() -> None:
    config = parse_config_text(CONFIG_TEXT.split("[service]")[0])
    assert resolve_tokens(config, ENVIRON).admin is None


def test_a_missing_variable_names_the_queue_and_the_variable() -> None:
    with pytest.raises(ConfigError) as err:
        resolve_tokens(specs(a="env:TEAM_A_TOKEN"), {})
    assert "'a'" in str(err.value) and "TEAM_A_TOKEN" in str(err.value)


def test_a_missing_admin_variable_names_the_setting() -> None:
    with pytest.raises(ConfigError, match=r"service\.admin_token.*PREEMPTIBLE_ADMIN_TOKEN"):
        resolve_tokens(specs(admin="env:PREEMPTIBLE_ADMIN_TOKEN"), {})


@pytest.mark.parametrize(
    ("spec", "environ"),
    [("env:A", {"A": "  "}), ("", {}), ("env:", {})],
    ids=["empty-variable", "empty-literal", "no-variable-name"],
)
def test_an_empty_token_is_a_config_error(spec: str, environ: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        resolve_tokens(specs(a=spec), environ)


def test_two_principals_with_one_token_are_refused_without_showing_it() -> None:
    with pytest.raises(ConfigError) as err:
        resolve_tokens(specs(admin="env:X", a="env:X"), {"X": "shared-secret-value"})
    assert "'a'" in str(err.value) and "admin" in str(err.value)
    assert "shared-secret-value" not in str(err.value)


def test_a_non_string_admin_token_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="admin_token"):
        resolve_tokens(specs(admin=42), {})  # type: ignore[arg-type]


def test_reprs_never_show_a_token() -> None:
    tokens = Tokens(admin=ADMIN_TOKEN, queues={"team-a": TEAM_A_TOKEN})
    shown = repr(tokens) + repr(Authenticator(tokens, lambda _: None)) + str(tokens)
    assert ADMIN_TOKEN not in shown and TEAM_A_TOKEN not in shown
    assert "team-a" in shown


@pytest.fixture
def authenticator() -> Authenticator:
    tokens = Tokens(admin=ADMIN_TOKEN, queues={"team-a": TEAM_A_TOKEN, "team-b": TEAM_B_TOKEN})
    owners = {
        "job-token-1": TokenOwner(job_id="j1", state=JobState.RUNNING),
        "job-token-2": TokenOwner(job_id="j2", state=JobState.COMPLETED),
    }
    return Authenticator(tokens, owners.get)


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (f"Bearer {ADMIN_TOKEN}", Principal(kind=PrincipalKind.ADMIN, name="admin")),
        (f"bearer {TEAM_A_TOKEN}", Principal(kind=PrincipalKind.QUEUE, name="team-a")),
        (f"BEARER   {TEAM_B_TOKEN} ", Principal(kind=PrincipalKind.QUEUE, name="team-b")),
        ("Bearer job-token-1", Principal(kind=PrincipalKind.JOB, name="j1")),
    ],
    ids=["admin", "queue", "scheme-case-and-spaces", "job"],
)
def test_authenticate_names_the_caller(
    authenticator: Authenticator, header: str | None, expected: Principal
) -> None:
    assert authenticator.authenticate(header) == expected


@pytest.mark.parametrize(
    "header",
    [None, "", "Bearer", "Bearer ", f"Basic {TEAM_A_TOKEN}", TEAM_A_TOKEN, "Bearer nope"],
    ids=["absent", "empty", "scheme-only", "blank-token", "basic", "no-scheme", "unknown"],
)
def test_authenticate_refuses_missing_and_unknown_tokens(
    authenticator: Authenticator, header: str | None
) -> None:
    with pytest.raises(AuthenticationError) as err:
        authenticator.authenticate(header)
    assert TEAM_A_TOKEN not in str(err.value) and "nope" not in str(err.value)


def test_the_token_of_a_finished_job_has_expired(authenticator: Authenticator) -> None:
    with pytest.raises(AuthenticationError, match="this job has finished; its token expired"):
        authenticator.authenticate("Bearer job-token-2")


def test_a_token_prefix_or_extension_is_not_a_match(authenticator: Authenticator) -> None:
    for near in (TEAM_A_TOKEN[:-1], TEAM_A_TOKEN + "x", TEAM_A_TOKEN.upper()):
        with pytest.raises(AuthenticationError):
            authenticator.authenticate(f"Bearer {near}")


def test_every_configured_token_is_compared_whichever_matches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[bytes] = []

    def counting_compare(a: bytes, b: bytes) -> bool:
        calls.append(b)
        return a == b

    monkeypatch.setattr(hmac, "compare_digest", counting_compare)  # auth calls it via hmac
    tokens = Tokens(admin=ADMIN_TOKEN, queues={"team-a": TEAM_A_TOKEN, "team-b": TEAM_B_TOKEN})
    for presented in (TEAM_A_TOKEN, TEAM_B_TOKEN, ADMIN_TOKEN, "unknown"):
        calls.clear()
        tokens.match(presented)
        assert len(calls) == 3, presented


def test_a_static_token_does_not_ask_the_manager() -> None:
    asked: list[str] = []

    def job_for_token(token: str) -> TokenOwner | None:
        asked.append(token)
        return None

    a = Authenticator(Tokens(queues={"team-a": TEAM_A_TOKEN}), job_for_token)
    a.authenticate(f"Bearer {TEAM_A_TOKEN}")
    assert asked == []
    with pytest.raises(AuthenticationError):
        a.authenticate("Bearer other")
    assert asked == ["other"]


def test_principal_rights() -> None:
    admin = Principal(kind=PrincipalKind.ADMIN, name="admin")
    team_a = Principal(kind=PrincipalKind.QUEUE, name="team-a")
    job = Principal(kind=PrincipalKind.JOB, name="team-a")  # a job id that looks like a queue
    assert admin.may_act_for_queue("team-b")
    assert team_a.may_act_for_queue("team-a") and not team_a.may_act_for_queue("team-b")
    assert not job.may_act_for_queue("team-a")


def test_bearer_token_parsing() -> None:
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("Token abc") is None
    assert bearer_token(None) is None


def test_nothing_is_logged_while_authenticating(
    authenticator: Authenticator, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    authenticator.authenticate(f"Bearer {TEAM_A_TOKEN}")
    with pytest.raises(AuthenticationError):
        authenticator.authenticate("Bearer wrong-token-value")
    assert TEAM_A_TOKEN not in caplog.text and "wrong-token-value" not in caplog.text
