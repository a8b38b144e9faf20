"""Agent specs: which command to run, how to read its output, how to continue it.

A run's payload names its agent in one of two shapes:

- a command: ``{"command": [...], "format": "claude-code" | "codex" | "agui" |
  "text", "env": {...}, "continue": false | true | [...]}``;
- a preset: ``{"preset": "scripted" | "claude-code" | "codex", ...options}``
  (or just the preset's name as a string), resolved to a command on the worker
  that runs it, so ``sys.executable`` is the worker's own.

How the prompt reaches the agent: as one argv element. An argv element that is
exactly ``{prompt}`` is replaced by the prompt (the presets have one); a
command without it does not get the prompt. Substitution is by whole element
only, so no prompt is ever parsed by a shell or spliced into another argument.

Secrets the operator keeps out of Postgres: ``env_from`` lists names of the
worker's own environment variables that the worker passes to the agent when it
builds the sandbox (only the operator's agent catalog may set it over HTTP).

Continuation (a new process after the sandbox was lost): ``continue`` false
means the agent cannot continue; true means run ``command`` again with the
continuation prompt; a list is the continuation argv, in which the whole
elements ``{prompt}``, ``{session_id}`` (the agent's own conversation id, from
:attr:`Translator.session_id`) and ``{start_turn}`` (the 0-based turn to resume
at) are replaced.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from turnkeeper.errors import AgentError, UnknownAgentError

Format = Literal["claude-code", "codex", "agui", "text"]
PROMPT = "{prompt}"
SESSION_ID = "{session_id}"
START_TURN = "{start_turn}"
PRESETS = ("scripted", "claude-code", "codex")
_ENV_FROM_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


def _check_argv(argv: list[str]) -> list[str]:
    if not argv:
        raise ValueError("must not be empty")
    if any("\x00" in arg for arg in argv):
        raise ValueError("arguments must not contain NUL")
    return argv


class AgentSpec(BaseModel):
    """A resolved agent: argv template, output format, extra environment."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    command: list[str]
    format: Format
    env: dict[str, str] = Field(default_factory=dict)
    env_from: list[str] = Field(default_factory=list)
    continue_: bool | list[str] = Field(default=False, alias="continue")
    preset: str | None = None
    """The preset this spec came from, kept so :meth:`to_payload` stays portable."""
    options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("command")
    @classmethod
    def _command(cls, value: list[str]) -> list[str]:
        return _check_argv(value)

    @field_validator("continue_")
    @classmethod
    def _continuation(cls, value: bool | list[str]) -> bool | list[str]:
        return _check_argv(value) if isinstance(value, list) else value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not key or "=" in key or "\x00" in key:
                raise ValueError(f"invalid environment variable name {key!r}")
        return value

    @field_validator("env_from")
    @classmethod
    def _env_from(cls, value: list[str]) -> list[str]:
        for name in value:
            if not _ENV_FROM_NAME.fullmatch(name) or name.upper().startswith("TURNKEEPER_"):
                raise ValueError(f"env_from cannot pass the worker variable {name!r}")
        return value

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any] | str) -> AgentSpec:
        """Validate a payload (or a preset name); AgentError says what is wrong."""
        if isinstance(payload, str):
            payload = {"preset": payload}
        if not isinstance(payload, Mapping):
            raise AgentError("an agent spec must be an object or a preset name", reason="bad-spec")
        if "preset" in payload:
            values = dict(payload)
            env_from = values.pop("env_from", [])
            spec = _preset(values)
            if not env_from:
                return spec
            payload = {**spec.model_dump(by_alias=True), "env_from": env_from}
        try:
            return cls.model_validate(dict(payload))
        except ValidationError as exc:
            raise AgentError(f"invalid agent spec: {_first_error(exc)}", reason="bad-spec") from exc

    def to_payload(self) -> dict[str, Any]:
        passed = {"env_from": list(self.env_from)} if self.env_from else {}
        if self.preset is not None:
            return {
                "preset": self.preset,
                **self.options,
                **({"env": self.env} if self.env else {}),
                **passed,
            }
        return {
            "command": list(self.command),
            "format": self.format,
            "env": dict(self.env),
            "continue": self.continue_,
            **passed,
        }

    @property
    def can_continue(self) -> bool:
        return self.continue_ is not False

    def argv(self, prompt: str) -> list[str]:
        """The command to start the agent with this prompt."""
        return [prompt if arg == PROMPT else arg for arg in self.command]

    def continuation_argv(
        self, prompt: str, *, session_id: str | None = None, start_turn: int = 0
    ) -> list[str]:
        """The command to continue an interrupted run in a new process."""
        if self.continue_ is False:
            raise AgentError("this agent cannot continue a run", reason="cannot-continue")
        if self.continue_ is True:
            return self.argv(prompt)
        if SESSION_ID in self.continue_ and not session_id:
            raise AgentError(
                "continuing this agent needs its session id, which it never reported",
                reason="no-session-id",
            )
        values = {PROMPT: prompt, SESSION_ID: session_id or "", START_TURN: str(start_turn)}
        return [values.get(arg, arg) for arg in self.continue_]


# --- presets --------------------------------------------------------------------------


class _ScriptedOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seed: int = 0
    turns: int = Field(default=2, ge=0, le=10_000)
    pace: float = Field(default=0.05, ge=0, le=60)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)


class _CliOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)


def _preset(payload: dict[str, Any]) -> AgentSpec:
    name = payload.pop("preset")
    try:
        if name == "scripted":
            options: BaseModel = _ScriptedOptions.model_validate(payload)
        elif name in ("claude-code", "codex"):
            options = _CliOptions.model_validate(payload)
        else:
            raise UnknownAgentError(
                f"unknown agent preset {name!r}; known: {', '.join(PRESETS)}",
                reason="unknown-preset",
            )
    except ValidationError as exc:
        raise AgentError(
            f"invalid options for preset {name!r}: {_first_error(exc)}", reason="bad-spec"
        ) from exc
    dumped = options.model_dump()
    env = dumped.pop("env")
    if name == "scripted":
        assert isinstance(options, _ScriptedOptions)  # noqa: S101 - narrowed above
        base = [sys.executable, "-m", "turnkeeper.agents.scripted", "--prompt", PROMPT]
        knobs = ["--seed", str(options.seed), "--turns", str(options.turns)]
        knobs += ["--pace", str(options.pace), *options.args]
        command = [*base, *knobs]
        continuation = [*base, *knobs, "--start-turn", START_TURN]
        fmt: Format = "claude-code"
    elif name == "claude-code":
        flags = ["--output-format", "stream-json", "--verbose", "--include-partial-messages"]
        command = ["claude", "-p", PROMPT, *flags, *dumped["args"]]
        continuation = ["claude", "-p", PROMPT, "--resume", SESSION_ID, *flags, *dumped["args"]]
        fmt = "claude-code"
    else:
        command = ["codex", "exec", "--json", *dumped["args"], PROMPT]
        continuation = ["codex", "exec", "--json", *dumped["args"], "resume", SESSION_ID, PROMPT]
        fmt = "codex"
    return AgentSpec(
        command=command,
        format=fmt,
        env=env,
        continue_=continuation,
        preset=name,
        options={k: v for k, v in dumped.items() if v != _defaults(options).get(k)},
    )


def _defaults(options: BaseModel) -> dict[str, Any]:
    return type(options)().model_dump()


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"]) or "spec"
    return f"{where}: {error['msg']}"
