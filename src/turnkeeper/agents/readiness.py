"""Can each agent of the catalog run here? Asked by ``turnkeeper doctor`` and once as a
worker starts (docs/agents.md, "Checks up front").

Nothing runs: the answers come from the settings, the worker's environment and its
files. Three questions per agent, and each problem is one line saying what to set:

- Its CLI: ``argv[0]`` is an executable on the PATH the agent gets (its env's ``PATH``,
  else the base one) in a directory the jail shows (the system directories,
  ``TURNKEEPER_SANDBOX_RO_BINDS``, a preset's own), and so is the interpreter its
  ``#!`` line names. Not asked under ``ssh``, whose agents run on another host.
- Its model host (``claude-code``, ``codex``): the ``host:port`` of its API is in
  ``TURNKEEPER_SANDBOX_EGRESS``. Not asked under ``local``, which has no egress proxy:
  its agents reach every host the worker reaches.
- Its key (``claude-code``, ``codex``): the catalog's ``env`` holds it, ``env_from``
  passes it (and the worker's environment has it), ``env_files`` reads it (and the
  file is readable) or ``request_env`` lets each request bring it. Every variable of
  ``env_from`` and file of ``env_files`` is checked too: a missing one fails every run.

The operator's agents (``TURNKEEPER_AGENTS_FILE``) are checked strictly. A preset as it
comes is checked once its CLI is where the jail finds it; until then it is reported as
not set up, which is no failure: a fresh machine runs ``scripted`` and nothing else.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import structlog

from turnkeeper.agents.catalog import Catalog, CatalogAgent
from turnkeeper.agents.spec import PRESETS, AgentSpec
from turnkeeper.agents.worker_env import read_env_file
from turnkeeper.config import Settings, parse_egress_allowlist
from turnkeeper.errors import AgentError, ConfigError
from turnkeeper.sandbox.exposure import AgentPaths, Bind, PrivatePath
from turnkeeper.sandbox.jail import SYSTEM_DIRS
from turnkeeper.sandbox.provider import BASE_PATH

log = structlog.get_logger(__name__)

Sees = Callable[[Path], bool]
"""Whether the agent's sandbox shows a host path at the same place."""


@dataclass(frozen=True)
class ModelApi:
    """Where a preset's CLI finds its model, and which key it needs."""

    keys: tuple[str, ...]
    """The env names the CLI takes its key from; the first is the one to set."""
    default_url: str
    url_env: str | None = None
    """The env variable that moves the endpoint (Claude Code's ``ANTHROPIC_BASE_URL``)."""
    url_option: str | None = None
    """The preset option that does (Codex ignores ``OPENAI_BASE_URL``: ``base_url``)."""
    package: str = ""
    """The npm package that installs the CLI."""


MODEL_APIS = {
    "claude-code": ModelApi(
        keys=("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN"),
        default_url="https://api.anthropic.com",
        url_env="ANTHROPIC_BASE_URL",
        package="@anthropic-ai/claude-code",
    ),
    "codex": ModelApi(
        keys=("OPENAI_API_KEY", "CODEX_API_KEY"),
        default_url="https://api.openai.com/v1",
        url_option="base_url",
        package="@openai/codex",
    ),
}


@dataclass(frozen=True)
class Readiness:
    """What the checks found for one agent."""

    agent: str
    problems: tuple[str, ...] = ()
    """One line each: what is wrong and what to set."""
    found: str = ""
    """What was found, on one line (no value of any variable, ever)."""
    configured: bool = True
    """False for a preset nobody set up (``found`` says why): reported, never a failure."""


def check_agents(settings: Settings, environ: Mapping[str, str] = os.environ) -> list[Readiness]:
    """Every agent of the catalog, in name order; a catalog that does not load is one
    problem of its own, and the presets are checked as they come."""
    try:
        agents = Catalog.load(settings).agents
    except ConfigError as exc:
        bare = {name: CatalogAgent(name, AgentSpec.from_payload(name)) for name in PRESETS}
        checked = [check_agent(settings, bare[name], environ) for name in sorted(bare)]
        return [Readiness("catalog", (exc.message,)), *checked]
    return [check_agent(settings, agents[name], environ) for name in sorted(agents)]


def agent_paths(settings: Settings) -> AgentPaths:
    """What the agents a worker may run bring to its jails (a preset's own binds) and
    to the paths no agent may see (a catalog agent's key files), for the worker's
    check of every bind (``sandbox.readiness.check_provider``). The presets count even
    where the catalog redefines their names: trusted callers submit them as they come.
    A catalog that does not load adds nothing of its own (``log_readiness`` says why)."""
    specs = [(name, AgentSpec.from_payload(name)) for name in sorted(PRESETS)]
    try:
        catalog = Catalog.load(settings).agents
    except ConfigError:
        catalog = {}
    specs += [(name, catalog[name].spec) for name in sorted(catalog)]
    binds: dict[str, Bind] = {}
    private: list[PrivatePath] = []
    for name, spec in specs:
        origin = f"the {spec.preset} preset" if spec.preset else f"agent {name}"
        for path in spec.read_only:
            binds.setdefault(path, Bind(path, origin))
        for key, path in sorted(spec.env_files.items()):
            private.append(PrivatePath(path, f"agent {name}'s {key} file (env_files)"))
    return AgentPaths(tuple(binds.values()), tuple(dict.fromkeys(private)))


def log_readiness(settings: Settings) -> None:
    """At a worker's start: each problem as a warning of its own. The worker starts
    anyway, as an operator may run only some of the catalog's agents."""
    for report in check_agents(settings):
        for problem in report.problems:
            log.warning("agent.not_ready", agent=report.agent, problem=problem)
        if not report.problems:
            event = "agent.ready" if report.configured else "agent.not_set_up"
            log.info(event, agent=report.agent, found=report.found)


def check_agent(
    settings: Settings, agent: CatalogAgent, environ: Mapping[str, str] = os.environ
) -> Readiness:
    """What stands in the way of ``agent`` on this worker, or what was found."""
    spec = agent.spec
    api = MODEL_APIS.get(spec.preset or "")
    provider = agent.provider or settings.sandbox_provider
    env, passing = _agent_env(agent, environ)
    search = env.get("PATH", BASE_PATH)
    lookup = _lookup(settings, provider, spec, search, environ.get("PATH", ""))
    install = f"npm install -g {api.package}" if api is not None else None
    cli_problem, cli_found = _cli(lookup, spec.command[0], install)
    if api is not None and not agent.operator and cli_problem is not None:
        return Readiness(agent.name, found=f"not set up: {cli_problem}", configured=False)
    model = [] if api is None else [_egress(settings, provider, spec, env, api), _key(agent, api)]
    problems = [cli_problem, *passing, *(problem for problem, _ in model)]
    found = [cli_found, *(what for _, what in model)]
    return Readiness(agent.name, tuple(p for p in problems if p), "; ".join(f for f in found if f))


def _agent_env(agent: CatalogAgent, environ: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """The env the agent will get, as far as this worker can tell (its ``PATH`` and
    endpoint matter here), and a problem for each variable or file it cannot pass."""
    spec = agent.spec
    env = {**spec.env, **agent.env}
    problems = []
    for name in spec.env_from:
        if name in environ:
            env[name] = environ[name]
        else:
            problems.append(
                f"{name}, which env_from passes, is not in the worker's environment: "
                "set it on every worker"
            )
    for name, path in spec.env_files.items():
        try:
            env[name] = read_env_file(name, path)
        except AgentError as exc:
            problems.append(f"{exc.message}; put the value there, readable by the worker's user")
    return env, problems


# --- the CLI ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Lookup:
    """How the agent's ``exec`` finds a program: its search path and what its sandbox
    shows; and the worker's own PATH, to say where a program is when the agent's misses."""

    search: str
    sees: Sees
    host_path: str

    def which(self, program: str, *, anywhere: bool = False) -> Path | None:
        """The first executable of the search path (or the path itself, holding a ``/``)
        that the sandbox shows; ``anywhere``: on either PATH, shown or not."""
        if "/" in program:
            candidates = [Path(program)]
        else:
            dirs = self.search.split(":")
            if anywhere:
                dirs += self.host_path.split(":")
            candidates = [Path(d) / program for d in dirs if d.startswith("/")]
        for candidate in candidates:
            shown = anywhere or self.sees(candidate)
            if shown and candidate.is_file() and os.access(candidate, os.X_OK):
                return candidate
        return None

    def not_found(self, program: str, *, why: str = "", install: str | None = None) -> str:
        """One line: the sandbox finds no ``program``, and what to set so that it does."""
        missing = f"{why}the jail finds no {program} on its PATH ({self.search})"
        on_host = self.which(program, anywhere=True)
        if on_host is None:
            fix = f"install it ({install})" if install else "install it there"
            return (
                f"{missing}: {fix}, or add its directory to TURNKEEPER_SANDBOX_RO_BINDS and "
                "to PATH in the agent's env"
            )
        # Bind what holds both the command and the file it links to (an npm prefix).
        directory, real = on_host.parent, on_host.resolve().parent
        common = Path(os.path.commonpath([directory, real]))
        binds = [common] if len(common.parts) > 2 else list(dict.fromkeys((directory, real)))
        steps = [
            f"add {bind} to TURNKEEPER_SANDBOX_RO_BINDS" for bind in binds if not self.sees(bind)
        ]
        if str(directory) not in self.search.split(":"):
            steps.append(f"add {directory} to PATH in the agent's env")
        return f"{missing}; this host has it at {on_host}: {' and '.join(steps)}"


def _cli(lookup: _Lookup | None, program: str, install: str | None) -> tuple[str | None, str]:
    """(the problem, or None; what was found) for the agent's ``argv[0]``."""
    if lookup is None:
        return None, f"{program}: not checked (the ssh provider runs it on its own host)"
    found = lookup.which(program)
    if found is None:
        return lookup.not_found(program, install=install), ""
    interpreter = _interpreter(found)
    if interpreter is not None and lookup.which(interpreter) is None:
        why = f"{program} ({found}) runs {interpreter} (its #! line), but "
        return lookup.not_found(interpreter, why=why), ""
    return None, str(found)


def _lookup(
    settings: Settings, provider: str, spec: AgentSpec, search: str, host_path: str
) -> _Lookup | None:
    """Where the agent looks for programs; None under ``ssh`` (another host's files)."""
    if provider == "ssh":
        return None
    sees = _everything if provider == "local" else _jail_view(settings, spec)
    return _Lookup(search, sees, host_path)


def _everything(_: Path) -> bool:
    return True


def _jail_view(settings: Settings, spec: AgentSpec) -> Sees:
    """What a bwrap jail shows: the system directories, the operator's read-only binds
    and the preset's own, each at its host path (``turnkeeper.sandbox.jail``)."""
    roots = (*SYSTEM_DIRS, *settings.ro_bind_paths, *spec.read_only)

    def under(path: str) -> bool:
        return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)

    def sees(path: Path) -> bool:
        try:
            real = path.resolve()
        except (OSError, RuntimeError):  # a symlink loop
            return False
        return under(str(path)) and under(str(real))

    return sees


def _interpreter(path: Path) -> str | None:
    """The program a script's ``#!`` line runs (``node`` for ``#!/usr/bin/env node``)."""
    try:
        with path.open("rb") as handle:
            head = handle.read(256)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].decode(errors="replace").split()
    if words and Path(words[0]).name == "env":
        words = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
    return words[0] if words else None


# --- the model host and the key ----------------------------------------------------------


def _egress(
    settings: Settings, provider: str, spec: AgentSpec, env: Mapping[str, str], api: ModelApi
) -> tuple[str | None, str]:
    """(the problem, or None; what was found) for the model API's ``host:port``."""
    url, source = api.default_url, "the default"
    if api.url_env and env.get(api.url_env):
        url, source = env[api.url_env], api.url_env
    elif api.url_option and spec.options.get(api.url_option):
        url, source = str(spec.options[api.url_option]), f"its {api.url_option} option"
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port or (80 if parts.scheme == "http" else 443)
    except ValueError:
        host = None
    if not host:
        return f"the model API's URL ({source}) names no host and port: fix it", ""
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if provider == "local":
        return None, f"{address} (egress not checked: the local provider has no proxy)"
    try:
        (entry,) = parse_egress_allowlist([address])
    except ValueError as exc:
        return f"the model API's host ({source}) cannot be allowed: {exc}", ""
    if entry not in settings.sandbox_egress:
        problem = (
            f"TURNKEEPER_SANDBOX_EGRESS does not allow {entry}, the model API's host "
            f"({source}): add it"
        )
        return problem, ""
    return None, f"{entry} allowed"


def _key(agent: CatalogAgent, api: ModelApi) -> tuple[str | None, str]:
    """(the problem, or None; where the key comes from) for the model key."""
    spec = agent.spec
    fixed = {**spec.env, **agent.env}
    for name in api.keys:
        if fixed.get(name):
            return None, f"{name} from the catalog's env"
        if name in spec.env_files:
            return None, f"{name} from {spec.env_files[name]}"
        if name in spec.env_from:
            return None, f"{name} from the worker's environment"
        if agent.request_env is not None and name in agent.request_env:
            return None, f"{name} from each request"
    main = api.keys[0]
    if not agent.operator:
        return None, f"{main} from each request's env (the preset passes none of the worker's)"
    problem = (
        f'no {main} for it: add env_from = ["{main}"] (and set {main} on every worker) '
        f'or env_files = {{ {main} = "/path/to/key" }} to its entry in TURNKEEPER_AGENTS_FILE'
    )
    return problem, ""
