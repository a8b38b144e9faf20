"""Agent specs: which command to run, how to read its output, how to continue it.

A run's payload names its agent in one of two shapes:

- a command: ``{"command": [...], "format": "claude-code" | "codex" | "agui" |
  "text", "env": {...}, "continue": false | true | [...]}``;
- a preset: ``{"preset": "scripted" | "claude-code" | "codex", ...options}``
  (or just the preset's name as a string), resolved to a command on the worker
  that runs it, so ``sys.executable`` is the worker's own.

How the prompt reaches the agent: an argv element that is exactly ``{prompt}``
becomes the prompt as one argument (at most 128 KiB, the kernel's limit for one
argument); one that is exactly ``{prompt_file}`` becomes the path of a file
holding it; ``"prompt_stdin": true`` makes it the agent's standard input. The
``claude-code`` and ``codex`` presets read it on standard input, so a prompt
that starts with ``-`` is never an option to them and any size up to the
request limit works. Substitution is by whole element only, and happens inside
the sandbox (see :mod:`turnkeeper.sandbox.command`), so no prompt is ever parsed
by a shell, spliced into another argument, or held on the argv of anything but
the agent.

Environment: names are ``[A-Za-z_][A-Za-z0-9_]*``, and names that make a program
load or run code of the caller's choosing are refused (``ENV_REFUSED``): an env
must never turn a fixed command into another one.

Secrets the operator keeps out of Postgres: ``env_from`` lists names of the
worker's own environment variables that the worker passes to the agent when it
builds the sandbox, and ``env_files`` maps names to files the worker reads then
(``turnkeeper.agents.worker_env``); only the operator's agent catalog may set
either over HTTP.

Continuation (a new process after the sandbox was lost): ``continue`` false
means the agent cannot continue; true means run ``command`` again with the
continuation prompt; a list is the continuation argv, in which the whole
elements ``{prompt}``, ``{prompt_file}``, ``{session_id}`` (the agent's own
conversation id, from :attr:`Translator.session_id`) and ``{start_turn}`` (the
0-based turn to resume at) are replaced.

Follow-ups (a later run of the same session, :meth:`AgentSpec.follow_up_command`):
an agent whose ``continue`` is a list resumes its own conversation with it, at turn
0, ``{session_id}`` being the id its earlier run reported, its ``fork`` arguments
appended (``claude -p --resume ID --fork-session``, ``codex exec resume ID``); any
other agent gets a new process each run, its command as in a first run, and
remembers nothing. The scripted agent continues from
the stored transcript instead (:attr:`AgentSpec.recalls_transcript`): its prompt
carries the earlier turns.

A conversation id comes from the agent's own output, which a prompt can steer, and
becomes an argument of the next process: only ids that cannot read as an option or
hold anything but ``[A-Za-z0-9._:-]`` are used (``safe_session_id``).
"""

from __future__ import annotations

import fnmatch
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

import turnkeeper
from turnkeeper.errors import (
    AgentError,
    EmptyPromptError,
    PromptError,
    PromptTooLongError,
    UnknownAgentError,
)
from turnkeeper.sandbox.command import (
    ENV_NAME,
    MAX_ARGUMENT_BYTES,
    PROMPT,
    AgentCommand,
    prompt_refusal,
)

Format = Literal["claude-code", "codex", "agui", "text"]
SESSION_ID = "{session_id}"
START_TURN = "{start_turn}"
PRESETS = ("scripted", "claude-code", "codex")
_ENV_FROM_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_SESSION_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,199}")


def safe_session_id(value: object) -> str | None:
    """``value`` when it may be an argument of an agent's command: it can never read as
    an option, a path or shell syntax; else None."""
    if isinstance(value, str) and _SESSION_ID.fullmatch(value):
        return value
    return None


ENV_REFUSED: tuple[tuple[str, str], ...] = (
    ("LD_*", "the dynamic loader preloads, audits or finds libraries through them"),
    ("GLIBC_TUNABLES", "glibc parses it in every process before main (CVE-2023-4911)"),
    ("GCONV_PATH", "glibc loads character-set converters, which are code, from it"),
    ("LOCPATH", "glibc loads locale data from it"),
    ("NLSPATH", "programs load message catalogues from it"),
    ("HOSTALIASES", "the resolver reads host aliases from it"),
    ("BASH_ENV", "bash sources this file before running a script"),
    ("ENV", "sh sources this file when it starts"),
    ("BASH_FUNC_*", "bash imports functions from such variables"),
    ("SHELLOPTS", "bash turns on options such as xtrace from it"),
    ("BASHOPTS", "bash turns on options from it"),
    ("PS4", "bash expands it, running any command substitution, when tracing"),
    ("PROMPT_COMMAND", "bash runs it as a command"),
    ("IFS", "it changes how every shell splits words"),
    ("PYTHONSTARTUP", "python runs this file"),
    ("PYTHONPATH", "python imports modules from it first"),
    ("PYTHONHOME", "python loads its standard library from it"),
    ("PYTHONUSERBASE", "python imports site packages from it"),
    ("PYTHONBREAKPOINT", "python imports and calls it at breakpoint()"),
    ("PYTHONWARNINGS", "python imports the warning categories it names"),
    ("PERL5OPT", "perl takes command-line switches (-M: load a module) from it"),
    ("PERL5LIB", "perl loads modules from it first"),
    ("PERLLIB", "perl loads modules from it first"),
    ("PERL5DB", "perl runs it as its debugger"),
    ("RUBYOPT", "ruby takes command-line switches (-r: require) from it"),
    ("RUBYLIB", "ruby loads libraries from it first"),
    ("NODE_OPTIONS", "node takes options (--require, --import) from it"),
    ("NODE_PATH", "node resolves modules from it"),
    ("NODE_REPL_EXTERNAL_MODULE", "node loads this module instead of its REPL"),
    ("JAVA_TOOL_OPTIONS", "the JVM takes options (-javaagent) from it"),
    ("_JAVA_OPTIONS", "the JVM takes options (-javaagent) from it"),
    ("JDK_JAVA_OPTIONS", "the java launcher takes options from it"),
    ("LUA_INIT*", "lua runs it, or the file it names, first"),
    ("GIT_SSH", "git runs it to connect"),
    ("GIT_SSH_COMMAND", "git runs it to connect"),
    ("GIT_PROXY_COMMAND", "git runs it to connect"),
    ("GIT_ASKPASS", "git runs it for credentials"),
    ("SSH_ASKPASS", "ssh and git run it for credentials"),
    ("GIT_EDITOR", "git runs it"),
    ("GIT_SEQUENCE_EDITOR", "git runs it"),
    ("GIT_PAGER", "git runs it"),
    ("GIT_EXTERNAL_DIFF", "git runs it"),
    ("GIT_EXEC_PATH", "git runs its subcommands from it"),
    ("GIT_TEMPLATE_DIR", "git copies hooks, which it runs, from it"),
    ("GIT_CONFIG*", "git reads configuration (core.hooksPath, core.fsmonitor: commands) from it"),
    ("HTTP_PROXY", "the jail's only way out is its egress proxy"),
    ("HTTPS_PROXY", "the jail's only way out is its egress proxy"),
    ("ALL_PROXY", "the jail's only way out is its egress proxy"),
    ("NO_PROXY", "the jail's only way out is its egress proxy"),
)
"""Environment names an agent spec may not set, each with the reason."""


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
    env_files: dict[str, str] = Field(default_factory=dict)
    """Env names whose values the worker reads from these files (absolute paths) as it
    builds the sandbox: the file's text without its trailing newline."""
    continue_: bool | list[str] = Field(default=False, alias="continue")
    fork: list[str] = Field(default_factory=list)
    """Arguments that make a follow-up's ``continue`` command start a new conversation
    from the one it resumes, leaving that one as it was (``--fork-session``): every
    run's conversation id then names the conversation as that run left it, so a
    branch may start at the end of any earlier run."""
    prompt_stdin: bool = False
    """The prompt is also the agent's standard input (otherwise it reads an empty one)."""
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
        for key, text in value.items():
            check_env_name(key)
            if "\x00" in text:
                raise ValueError(f"the value of {key} contains NUL")
            # The limit the spawn applies (``check_command``), before a run exists.
            size = len(key.encode()) + 1 + len(text.encode(errors="surrogatepass"))
            if size > MAX_ARGUMENT_BYTES:
                raise ValueError(
                    f"the environment variable {key} is {size} bytes as NAME=value, more "
                    f"than the {MAX_ARGUMENT_BYTES} one exec can pass: give the agent a file"
                )
        return value

    @field_validator("env_from")
    @classmethod
    def _env_from(cls, value: list[str]) -> list[str]:
        for name in value:
            if not _ENV_FROM_NAME.fullmatch(name) or name.upper().startswith("TURNKEEPER_"):
                raise ValueError(f"env_from cannot pass the worker variable {name!r}")
            check_env_name(name)
        return value

    @field_validator("env_files")
    @classmethod
    def _env_files(cls, value: dict[str, str]) -> dict[str, str]:
        for name, path in value.items():
            if not _ENV_FROM_NAME.fullmatch(name) or name.upper().startswith("TURNKEEPER_"):
                raise ValueError(f"cannot set the variable {name!r}")
            check_env_name(name)
            if not path.startswith("/") or "\x00" in path:
                raise ValueError(f"the file of {name} must be an absolute path")
        return value

    @model_validator(mode="after")
    def _passed_once(self) -> Self:
        twice = sorted(set(self.env_from) & set(self.env_files))
        if twice:
            raise ValueError(f"{', '.join(twice)}: named by both env_from and env_files")
        return self

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any] | str) -> AgentSpec:
        """Validate a payload (or a preset name); AgentError says what is wrong."""
        if isinstance(payload, str):
            payload = {"preset": payload}
        if not isinstance(payload, Mapping):
            raise AgentError("an agent spec must be an object or a preset name", reason="bad-spec")
        if "preset" in payload:
            values = dict(payload)
            passed: dict[str, Any] = {
                k: values.pop(k) for k in ("env_from", "env_files") if k in values
            }
            spec = _preset(values)
            if not any(passed.values()):
                return spec
            payload = {**spec.model_dump(by_alias=True), **passed}
        try:
            return cls.model_validate(dict(payload))
        except ValidationError as exc:
            raise AgentError(f"invalid agent spec: {_first_error(exc)}", reason="bad-spec") from exc

    def to_payload(self) -> dict[str, Any]:
        passed: dict[str, Any] = {"env_from": list(self.env_from)} if self.env_from else {}
        if self.env_files:
            passed["env_files"] = dict(self.env_files)
        if self.preset is not None:
            implied = CLAUDE_CODE_ENV if self.preset == "claude-code" else {}
            env = {k: v for k, v in self.env.items() if implied.get(k) != v}
            return {
                "preset": self.preset,
                **self.options,
                **({"env": env} if env else {}),
                **passed,
            }
        return {
            "command": list(self.command),
            "format": self.format,
            "env": dict(self.env),
            "continue": self.continue_,
            **({"fork": list(self.fork)} if self.fork else {}),
            **({"prompt_stdin": True} if self.prompt_stdin else {}),
            **passed,
        }

    @property
    def can_continue(self) -> bool:
        return self.continue_ is not False

    @property
    def read_only(self) -> tuple[str, ...]:
        """Host paths the agent needs to see in its jail: for the scripted preset, this
        worker's Python and the package (never a request's choice)."""
        if self.preset != "scripted":
            return ()
        package = Path(turnkeeper.__file__).resolve().parent
        return tuple(dict.fromkeys([sys.prefix, sys.base_prefix, str(package)]))

    def command_for(self, argv: list[str]) -> AgentCommand:
        return AgentCommand(
            tuple(argv),
            env=dict(self.env),
            stdin_prompt=self.prompt_stdin,
            read_only=self.read_only,
        )

    def start_command(self) -> AgentCommand:
        """The first agent process; the prompt reaches it inside its sandbox."""
        return self.command_for(list(self.command))

    def continuation_command(
        self, *, session_id: str | None = None, start_turn: int = 0
    ) -> AgentCommand:
        """A new process that continues an interrupted run (given the continuation prompt)."""
        if self.continue_ is False:
            raise AgentError("this agent cannot continue a run", reason="cannot-continue")
        if self.continue_ is True:
            return self.start_command()
        if SESSION_ID in self.continue_ and not session_id:
            raise AgentError(
                "continuing this agent needs its session id, which it never reported",
                reason="no-session-id",
            )
        if session_id is not None and safe_session_id(session_id) is None:
            raise AgentError(
                "the agent reported a session id that cannot be passed back to it safely",
                reason="unsafe-session-id",
            )
        values = {SESSION_ID: session_id or "", START_TURN: str(start_turn)}
        return self.command_for([values.get(arg, arg) for arg in self.continue_])

    @property
    def recalls_transcript(self) -> bool:
        """A follow-up of this agent is given the earlier turns in its prompt, from the
        stored transcript (the scripted agent), instead of resuming a conversation of
        its own."""
        return self.preset == "scripted"

    def follow_up_command(self, *, session_id: str | None) -> AgentCommand:
        """The first process of a follow-up run: the ``continue`` list at turn 0 resumes
        the agent's own conversation ``session_id``; an agent without one (``continue``
        true or false), one that recalls the transcript, or one whose list needs an id
        its earlier run never reported (or reported unsafely) starts as in a first run."""
        template = self.continue_
        if not isinstance(template, list) or self.recalls_transcript:
            return self.start_command()
        resumable = safe_session_id(session_id)
        if SESSION_ID in template and resumable is None:
            return self.start_command()
        resumed = self.continuation_command(session_id=resumable, start_turn=0)
        return replace(resumed, argv=(*resumed.argv, *self.fork))

    def branch_refusal(self, *, at_run_end: bool, at_leaf: bool) -> str | None:
        """Why a follow-up of this agent cannot start from an earlier entry (a branch),
        or None when it can: one that recalls the transcript or remembers nothing can
        start anywhere; one that resumes a conversation of its own only where a
        conversation id names exactly what came before (``fork``: the end of a run;
        without it: the session's latest entry, which is no branch)."""
        template = self.continue_
        if self.recalls_transcript or not isinstance(template, list):
            return None
        if SESSION_ID not in template or at_leaf:
            return None
        if self.fork:
            if at_run_end:
                return None
            return (
                "this agent can fork its conversation only where an earlier run ended: "
                "start the branch from the last entry of a run"
            )
        return (
            "this agent cannot fork its conversation: it can only go on from the "
            "session's latest entry"
        )

    @property
    def prompt_as_argument(self) -> bool:
        """Whether a process of this agent, its first or a continuation, is given the
        prompt as one argument (``{prompt}``), which bounds the prompt's size."""
        continuation = self.continue_ if isinstance(self.continue_, list) else []
        return PROMPT in self.command or PROMPT in continuation

    def check_prompt(self, prompt: str) -> None:
        """Refuse, before a run is admitted, a prompt this agent can never be given:
        the decision its spawn makes (``prompt_refusal``), on the UTF-8 bytes the agent
        would receive. A follow-up that recalls the transcript gives it more, which
        only the spawn can see."""
        try:
            data = prompt.encode()
        except UnicodeEncodeError as exc:
            raise PromptError(
                "the prompt is not UTF-8 text: it holds a lone surrogate", reason="bad-prompt"
            ) from exc
        refusal = prompt_refusal(data, as_argument=self.prompt_as_argument)
        if refusal is not None:
            kind = PromptTooLongError if refusal.reason == "prompt-too-long" else PromptError
            raise kind(refusal.message, reason=refusal.reason, **refusal.fields)

    def argv(self, prompt: str) -> list[str]:
        """The argv of a direct run, outside any sandbox, for tests and benchmarks:
        ``{prompt}`` replaced (a ``prompt_stdin`` agent needs the prompt on stdin)."""
        return [prompt if arg == PROMPT else arg for arg in self.command]


def require_prompt(prompt: str) -> str:
    """The prompt of a request, refused when it holds nothing but whitespace: a run
    over HTTP or from ``turnkeeper submit`` needs input. (``Client.submit`` takes one,
    for a trusted caller's command that reads no input.)"""
    if not prompt.strip():
        raise EmptyPromptError(
            "the prompt is empty: give the agent the input of its turn", reason="empty-prompt"
        )
    return prompt


def check_env_name(name: str) -> None:
    """Raise ValueError saying why an agent may not get variable ``name``."""
    if ENV_NAME.fullmatch(name) is None:
        raise ValueError(f"invalid environment variable name {name!r}")
    for pattern, reason in ENV_REFUSED:
        if fnmatch.fnmatchcase(name.upper() if "PROXY" in pattern else name, pattern):
            raise ValueError(f"environment variable {name} is refused: {reason}")


# --- presets --------------------------------------------------------------------------


class _ScriptedOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seed: int = 0
    turns: int = Field(default=2, ge=0, le=10_000)
    pace: float = Field(default=0.05, ge=0, le=60)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)


_NotAnOption = Annotated[str, Field(pattern=r"^[^-\s][^\r\n]*$")]
"""An option's value that the CLI can never read as an option of its own."""


class _ClaudeCodeOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    permission_mode: Literal["bypassPermissions", "acceptEdits", "auto", "dontAsk", "plan"] = (
        "bypassPermissions"
    )
    """Claude Code's ``--permission-mode``. In ``-p`` mode nobody answers a permission
    prompt, so only ``bypassPermissions`` lets tools that need permission run; the jail
    is the boundary (``dontAsk`` runs only what ``allowed_tools`` allows)."""
    allowed_tools: list[_NotAnOption] = Field(default_factory=list)
    """``--allowedTools``: the only tools that run without asking (``Bash(git *)``, ...)."""
    disallowed_tools: list[_NotAnOption] = Field(default_factory=list)
    """``--disallowedTools``: tools that never run, whatever the mode."""
    model: _NotAnOption | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)


class _CodexOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    profile: _NotAnOption | None = None
    """``--profile``: a profile of the agent's ``~/.codex/config.toml`` (its model,
    provider, tools) that narrows what the preset allows."""
    base_url: str | None = Field(default=None, pattern=r"^https?://[^\s\"'\\]+$")
    """The Responses API's base URL (``https://api.openai.com/v1`` unless set): Codex
    takes it from its config (``openai_base_url``), not from ``OPENAI_BASE_URL``."""
    model: _NotAnOption | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)


CLAUDE_CODE_ENV = {
    # Claude Code refuses bypassPermissions as root unless told it runs in a sandbox,
    # which it does (the jail); under `local` the worker logs that it is no boundary.
    "IS_SANDBOX": "1",
    # No update checks, telemetry or error reports: the jail lets out only the egress
    # the operator allows, and a headless turn has no use for them.
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_AUTOUPDATER": "1",
}
"""What the ``claude-code`` preset sets unless the spec's own env says otherwise."""
CODEX_FLAGS = ("--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox")
"""Codex runs outside a git repository and without its own sandbox, which cannot start
inside the jail (it needs namespaces of its own); the jail is the boundary."""
PERMISSIONS_OFF = {"claude-code", "codex"}
"""Presets that turn their agent's own permission checks off: only a jail bounds them."""


@dataclass(frozen=True)
class _PresetCommands:
    command: list[str]
    continuation: list[str]
    fork: list[str]
    format: Format
    env: dict[str, str]


def _scripted(options: _ScriptedOptions) -> _PresetCommands:
    base = [sys.executable, "-m", "turnkeeper.agents.scripted", "--prompt", PROMPT]
    knobs = ["--seed", str(options.seed), "--turns", str(options.turns)]
    knobs += ["--pace", str(options.pace), *options.args]
    continuation = [*base, *knobs, "--start-turn", START_TURN]
    return _PresetCommands([*base, *knobs], continuation, [], "claude-code", options.env)


def _claude_code(options: _ClaudeCodeOptions) -> _PresetCommands:
    """``claude -p`` with no prompt argument reads the prompt on stdin."""
    flags = ["--output-format", "stream-json", "--verbose", "--include-partial-messages"]
    flags += ["--permission-mode", options.permission_mode]
    if options.allowed_tools:
        flags += ["--allowedTools", ",".join(options.allowed_tools)]
    if options.disallowed_tools:
        flags += ["--disallowedTools", ",".join(options.disallowed_tools)]
    if options.model:
        flags += ["--model", options.model]
    flags += options.args
    return _PresetCommands(
        ["claude", "-p", *flags],
        ["claude", "-p", "--resume", SESSION_ID, *flags],
        ["--fork-session"],
        "claude-code",
        {**CLAUDE_CODE_ENV, **options.env},
    )


def _codex(options: _CodexOptions) -> _PresetCommands:
    """``codex exec ... -``: ``-`` reads the prompt on stdin."""
    flags = ["--json", *CODEX_FLAGS]
    if options.profile:
        flags += ["--profile", options.profile]
    if options.base_url:
        flags += ["-c", f'openai_base_url="{options.base_url}"']
    if options.model:
        flags += ["--model", options.model]
    flags += options.args
    return _PresetCommands(
        ["codex", "exec", *flags, "-"],
        ["codex", "exec", *flags, "resume", SESSION_ID, "-"],
        [],  # codex exec resume cannot fork a thread
        "codex",
        dict(options.env),
    )


_PRESET_BUILDERS: dict[str, tuple[type[BaseModel], Callable[[Any], _PresetCommands]]] = {
    "scripted": (_ScriptedOptions, _scripted),
    "claude-code": (_ClaudeCodeOptions, _claude_code),
    "codex": (_CodexOptions, _codex),
}


def _preset(payload: dict[str, Any]) -> AgentSpec:
    name = payload.pop("preset")
    if name not in _PRESET_BUILDERS:
        raise UnknownAgentError(
            f"unknown agent preset {name!r}; known: {', '.join(PRESETS)}",
            reason="unknown-preset",
        )
    model, build = _PRESET_BUILDERS[name]
    try:
        options = model.model_validate(payload)
    except ValidationError as exc:
        raise AgentError(
            f"invalid options for preset {name!r}: {_first_error(exc)}", reason="bad-spec"
        ) from exc
    built = build(options)
    chosen = options.model_dump(exclude={"env"})
    defaults = model().model_dump(exclude={"env"})
    try:
        return AgentSpec(
            command=built.command,
            format=built.format,
            env=built.env,
            continue_=built.continuation,
            fork=built.fork,
            prompt_stdin=name != "scripted",
            preset=name,
            options={k: v for k, v in chosen.items() if v != defaults.get(k)},
        )
    except ValidationError as exc:
        raise AgentError(
            f"invalid options for preset {name!r}: {_first_error(exc)}", reason="bad-spec"
        ) from exc


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"]) or "spec"
    return f"{where}: {str(error['msg']).removeprefix('Value error, ')}"
