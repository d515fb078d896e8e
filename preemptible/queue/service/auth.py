"""Who is calling: bearer tokens per queue, one admin token, and each job's own token.

Three kinds of caller (docs/maintainers/design.md, "Service"): the admin sees everything; a queue
token acts for its team's queue only; a job's own token (`PREEMPTIBLE_TOKEN` in the job's
environment) reaches only that job's cost, notice, checkpointed and progress endpoints, and only
until the job has finished: then it is refused as expired (401). The queue and admin
tokens come from the configuration as specs (`"env:TEAM_A_TOKEN"` reads the environment, anything
else is the token itself); job tokens belong to the manager, which answers `job_for_token`.

A presented token is compared with every configured token by `hmac.compare_digest`, all of
them every time, so the time taken says neither whether nor which one matched. A token never
appears in a message, a log line or a repr: errors name the queue and the variable instead.
Rejected alternative: a dict from token to principal, whose hash lookup is fast but not
constant-time in the token.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from preemptible.errors import ConfigError, QueueError
from preemptible.queue.service.views import ADMIN, Principal, PrincipalKind, TokenOwner

ENV_PREFIX = "env:"
"""A token spec starting with this names an environment variable that holds the token."""


class AuthenticationError(QueueError, PermissionError):
    """No token, or a token this server does not know (HTTP 401).

    Lives here until the shared error tree (`preemptible/errors.py`) gains a 401 error.
    """


@dataclass(frozen=True, slots=True)
class Tokens:
    """The resolved admin and queue tokens. The repr shows which exist, never their values."""

    admin: str | None = field(default=None, repr=False)
    queues: Mapping[str, str] = field(default_factory=dict, repr=False)
    """Queue name -> token."""

    def __repr__(self) -> str:
        admin = "set" if self.admin else "unset"
        return f"Tokens(admin={admin}, queues={sorted(self.queues)!r})"

    def match(self, presented: str) -> Principal | None:
        """The principal whose configured token this is, compared in constant time.

        Every configured token is compared, whatever matched before, so the time taken does
        not depend on which token (if any) the presented one is.
        """
        given = presented.encode("utf-8")
        found: Principal | None = None
        candidates: list[tuple[Principal, str]] = [
            (Principal(kind=PrincipalKind.QUEUE, name=q), t) for q, t in self.queues.items()
        ]
        if self.admin is not None:
            candidates.append((ADMIN, self.admin))
        for principal, token in candidates:
            if hmac.compare_digest(given, token.encode("utf-8")) and found is None:
                found = principal
        return found


class _HasTokenSpecs(Protocol):
    @property
    def tokens(self) -> Mapping[str, str]: ...


def resolve_tokens(config: _HasTokenSpecs, environ: Mapping[str, str]) -> Tokens:
    """Read the configured token specs: `env:NAME` from `environ`, anything else literally.

    The admin token is the spec `config.admin_token` (the `[service]` table's `admin_token`),
    or none when the configuration has no such setting.

    Args:
        config: the parsed queue configuration.
        environ: the environment to read `env:` specs from (usually `os.environ`).

    Raises:
        ConfigError: a variable is missing or empty, or two principals share a token; the
            message names the queue (or admin) and the variable, never a token.
    """
    queues = {q: _resolve(spec, f"queue {q!r}", environ) for q, spec in config.tokens.items()}
    admin_spec: Any = getattr(config, "admin_token", None)
    admin: str | None = None
    if admin_spec is not None:
        if not isinstance(admin_spec, str):
            raise ConfigError(
                "service.admin_token: expected a string such as 'env:PREEMPTIBLE_ADMIN_TOKEN'"
            )
        admin = _resolve(admin_spec, "service.admin_token", environ)
    owners: dict[str, str] = {}
    for owner, token in [*((f"queue {q!r}", t) for q, t in queues.items()), ("the admin", admin)]:
        if token is None:
            continue
        if token in owners:
            raise ConfigError(
                f"{owners[token]} and {owner} have the same token; give each its own, or a "
                "token could not say who is calling"
            )
        owners[token] = owner
    return Tokens(admin=admin, queues=queues)


def _resolve(spec: str, owner: str, environ: Mapping[str, str]) -> str:
    if spec.startswith(ENV_PREFIX):
        variable = spec.removeprefix(ENV_PREFIX).strip()
        if not variable:
            raise ConfigError(f"{owner}: 'env:' must name a variable, e.g. 'env:TEAM_A_TOKEN'")
        value = environ.get(variable)
        if value is None:
            raise ConfigError(
                f"{owner}: the token is read from the environment variable {variable}, which "
                f"is not set; export {variable} before starting the server"
            )
        if not value.strip():
            raise ConfigError(f"{owner}: the environment variable {variable} is empty")
        return value
    if not spec.strip():
        raise ConfigError(f"{owner}: the token is empty; write a token or 'env:VARIABLE'")
    return spec


class Authenticator:
    """Turns an `Authorization` header into a `Principal`."""

    def __init__(self, tokens: Tokens, job_for_token: Callable[[str], TokenOwner | None]) -> None:
        """Args:
        tokens: the admin and queue tokens.
        job_for_token: the manager's lookup of a job's own token (None: not a job token).
        """
        self._tokens = tokens
        self._job_for_token = job_for_token

    def __repr__(self) -> str:
        return f"Authenticator({self._tokens!r})"

    def authenticate(self, header: str | None) -> Principal:
        """The caller named by `Authorization: Bearer <token>`.

        Raises:
            AuthenticationError: no bearer token, one that is neither a configured token nor
                a job's own, or the token of a job that has finished (it expired with the job).
        """
        token = bearer_token(header)
        if token is None:
            raise AuthenticationError(
                "no bearer token: send 'Authorization: Bearer <token>' (the CLI reads "
                "--token or PREEMPTIBLE_TOKEN)"
            )
        principal = self._tokens.match(token)
        if principal is not None:
            return principal
        owner = self._job_for_token(token)
        if owner is not None and owner.state.finished:
            raise AuthenticationError(
                f"this job has finished; its token expired (job {owner.job_id!r} is "
                f"{owner.state.value})"
            )
        if owner is not None:
            return Principal(kind=PrincipalKind.JOB, name=owner.job_id)
        raise AuthenticationError(
            "the bearer token is not valid here: use your queue's token, the admin token, or "
            "the job's own PREEMPTIBLE_TOKEN"
        )


def bearer_token(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header; None if absent or another scheme."""
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token
