"""The agent catalog: what an HTTP client may run, and within which limits.

Over HTTP, ``agent`` is a name: a preset (``scripted``, ``claude-code``,
``codex``) or an agent the operator defines in ``TURNKEEPER_AGENTS_FILE``
(docs/agents.md describes every key)::

    [agents.reviewer]
    preset = "claude-code"            # or: command = [...], format = "..."
    model = "sonnet"                  # the preset's options
    env_from = ["ANTHROPIC_API_KEY"]  # worker variables passed through at spawn
    env_files = { GH_TOKEN = "/etc/turnkeeper/gh.token" }  # worker files read at spawn
    env = { REVIEW_MODE = "strict" }  # fixed values (sealed at rest like any env)
    request_env = ["REVIEW_TOPIC"]    # the env names a request may set
    provider = "bwrap"                # the weakest sandbox it may run in
    timeout = 900                     # seconds, at most
    max_attempts = 3                  # at most

An inline spec (``{"command": [...]}``, or a preset with options) is only for
keys created with ``--allow-commands``, and never names worker variables or
files. What a request adds can only tighten: a shorter timeout, fewer attempts,
a sandbox at least as strong, env names the catalog does not fix. An agent that
is passed worker variables or files takes from a request only the env names its
``request_env`` lists (none unless it says): a request that could set
``ANTHROPIC_BASE_URL``, ``PATH`` or ``HOME`` beside the operator's API key could
send that key to a host of its choosing.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from turnkeeper.agents.spec import PRESETS, AgentSpec
from turnkeeper.config import Settings
from turnkeeper.errors import (
    AgentError,
    ConfigError,
    InvalidInputError,
    NotPermittedError,
    UnknownAgentError,
)

PROVIDERS = ("local", "bwrap", "ssh")
_AGENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
_POLICY_FIELDS = (
    "env",
    "env_from",
    "env_files",
    "request_env",
    "provider",
    "timeout",
    "max_attempts",
)


def at_least_as_strong(requested: str, floor: str) -> bool:
    """Whether sandbox ``requested`` isolates at least as well as ``floor``.

    ``bwrap`` jails the agent on the worker's host, ``local`` does not; ``ssh``
    moves it to another host, a different promise that is comparable to neither,
    so it only ever stands for itself. Stricter than the worker's own rule
    (:func:`turnkeeper.sandbox.factory.at_least_as_strong`), which trusted callers
    meet: a tenant cannot move its agent off the sandbox host the operator chose.
    """
    return requested == floor or (floor == "local" and requested == "bwrap")


@dataclass(frozen=True)
class CatalogAgent:
    """One runnable agent and the limits a request must stay within."""

    name: str
    spec: AgentSpec
    provider: str | None = None
    timeout: float | None = None
    max_attempts: int | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    request_env: frozenset[str] | None = None
    """The env names a request may set; ``None``: any the catalog does not fix."""
    operator: bool = False
    """Defined in ``TURNKEEPER_AGENTS_FILE``, not a preset as it comes."""


@dataclass(frozen=True)
class Admission:
    """A request resolved against the catalog: exactly what ``Client.submit`` takes."""

    agent: dict[str, Any]
    env: dict[str, str]
    provider: str | None
    timeout: float
    max_attempts: int


class Catalog:
    """The presets plus the operator's agents (which may redefine a preset's name)."""

    def __init__(self, settings: Settings, agents: Mapping[str, CatalogAgent]) -> None:
        self.settings = settings
        self.agents = dict(agents)

    @classmethod
    def load(cls, settings: Settings) -> Catalog:
        agents = {name: CatalogAgent(name, AgentSpec.from_payload(name)) for name in PRESETS}
        if settings.agents_file is not None:
            agents.update(_read_agents_file(settings.agents_file))
        return cls(settings, agents)

    @property
    def names(self) -> list[str]:
        return sorted(self.agents)

    def admit(
        self,
        agent: str | Mapping[str, Any],
        *,
        allow_commands: bool,
        env: Mapping[str, str] | None = None,
        provider: str | None = None,
        timeout: float | None = None,
        max_attempts: int | None = None,
    ) -> Admission:
        """Resolve a request, refusing what would loosen the catalog or the settings."""
        entry = self._entry(agent, allow_commands=allow_commands)
        settings = self.settings
        floor = entry.provider or settings.sandbox_provider
        if provider is not None and not at_least_as_strong(provider, floor):
            raise NotPermittedError(
                f"sandbox {provider!r} is not at least as strong as {floor!r}, the least "
                f"agent {entry.name!r} may run in",
                reason="provider-downgrade",
            )
        most_time = entry.timeout or settings.run_timeout
        if timeout is not None and not (0 < timeout <= most_time and math.isfinite(timeout)):
            raise InvalidInputError(
                f"timeout must be above 0 and at most {most_time:g} seconds for agent "
                f"{entry.name!r}, got {timeout:g}",
                reason="timeout-out-of-range",
            )
        most_attempts = entry.max_attempts or settings.max_attempts
        if max_attempts is not None and not 1 <= max_attempts <= most_attempts:
            raise InvalidInputError(
                f"max_attempts must be between 1 and {most_attempts} for agent "
                f"{entry.name!r}, got {max_attempts}",
                reason="attempts-out-of-range",
            )
        fixed = set(entry.env) | set(entry.spec.env_from) | set(entry.spec.env_files)
        overridden = sorted(fixed & set(env or {}))
        if overridden:
            raise NotPermittedError(
                f"agent {entry.name!r} fixes the env variable(s) {', '.join(overridden)}",
                reason="env-fixed",
            )
        if entry.request_env is not None:
            unlisted = sorted(set(env or {}) - entry.request_env)
            if unlisted:
                listed = ", ".join(sorted(entry.request_env)) or "none"
                raise NotPermittedError(
                    f"agent {entry.name!r} is passed worker secrets, so a request may set "
                    f"only the env names its catalog entry lists in request_env ({listed}), "
                    f"not {', '.join(unlisted)}",
                    reason="env-not-listed",
                )
        return Admission(
            agent=entry.spec.to_payload(),
            env={**entry.env, **(env or {})},
            provider=provider or entry.provider,
            timeout=timeout or most_time,
            max_attempts=max_attempts or most_attempts,
        )

    def _entry(self, agent: str | Mapping[str, Any], *, allow_commands: bool) -> CatalogAgent:
        if isinstance(agent, str):
            entry = self.agents.get(agent)
            if entry is None:
                raise UnknownAgentError(
                    f"unknown agent {agent!r}; the catalog has: {', '.join(self.names)}",
                    reason="unknown-agent",
                )
            return entry
        if not allow_commands:
            raise NotPermittedError(
                "this key may run the catalog's agents by name "
                f"({', '.join(self.names)}); an inline agent spec needs a key created "
                "with --allow-commands",
                reason="inline-agent",
            )
        if "env_from" in agent:
            raise NotPermittedError(
                "env_from passes worker variables: only the operator's catalog may set it",
                reason="env-from",
            )
        if "env_files" in agent:
            raise NotPermittedError(
                "env_files reads files of the worker: only the operator's catalog may set it",
                reason="env-files",
            )
        # Its env stays in the spec: the caller's own, which the request may extend.
        return CatalogAgent("inline", AgentSpec.from_payload(dict(agent)))


def _read_agents_file(path: Path) -> dict[str, CatalogAgent]:
    where = f"TURNKEEPER_AGENTS_FILE ({path})"
    try:
        document = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{where}: cannot read it: {exc.strerror}", reason="agents-file") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: not TOML: {exc}", reason="agents-file") from exc
    table = document.get("agents", {})
    unknown = sorted(set(document) - {"agents"})
    if unknown or not isinstance(table, dict):
        raise ConfigError(f"{where}: only [agents.NAME] tables belong here", reason="agents-file")
    return {name: _catalog_agent(where, name, body) for name, body in table.items()}


def _catalog_agent(where: str, name: str, body: Any) -> CatalogAgent:
    def bad(problem: str) -> ConfigError:
        return ConfigError(f"{where}: agent {name!r}: {problem}", reason="agents-file")

    if not isinstance(body, dict):
        raise bad("must be a table")
    if _AGENT_NAME.fullmatch(name) is None:
        raise bad("a name is 1 to 64 ASCII letters, digits, '-' and '_'")
    values = dict(body)
    policy = {k: values.pop(k) for k in _POLICY_FIELDS if k in values}
    env = policy.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise bad("env maps names to strings")
    provider = policy.get("provider")
    if provider is not None and provider not in PROVIDERS:
        raise bad(f"provider is one of {', '.join(PROVIDERS)}")
    timeout = policy.get("timeout")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0
    ):
        raise bad("timeout is a positive number of seconds")
    attempts = policy.get("max_attempts")
    if attempts is not None and (
        isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= 100
    ):
        raise bad("max_attempts is an integer from 1 to 100")
    env_files = policy.get("env_files", {})
    if not isinstance(env_files, dict) or not all(isinstance(v, str) for v in env_files.values()):
        raise bad("env_files maps env names to file paths")
    request_env = policy.get("request_env")
    if request_env is not None and (
        not isinstance(request_env, list) or not all(isinstance(n, str) for n in request_env)
    ):
        raise bad("request_env is a list of env names")
    try:
        passed = {"env_from": policy.get("env_from", []), "env_files": env_files}
        spec = AgentSpec.from_payload({**values, **passed})
        names = dict.fromkeys(request_env or [], "")
        AgentSpec.from_payload({**spec.to_payload(), "env": {**env, **names}})  # valid names
    except AgentError as exc:
        raise bad(exc.message) from exc
    if request_env is None and (spec.env_from or spec.env_files):
        request_env = []  # the operator's secrets go only where the catalog says
    return CatalogAgent(
        name,
        spec,
        provider=provider,
        timeout=None if timeout is None else float(timeout),
        max_attempts=attempts,
        env=env,
        request_env=None if request_env is None else frozenset(request_env),
        operator=True,
    )
