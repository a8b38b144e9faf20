"""Settings: every knob of turnkeeper, read from ``TURNKEEPER_*`` variables.

Settings are read only at the edges (the CLI, the Celery app, the web app) and
passed down; no other module reads the environment.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
import socket
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Literal, Self
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from turnkeeper.errors import ConfigError

ENV_PREFIX = "TURNKEEPER_"
MIN_SECRET_BYTES = 32

_POSTGRES_SCHEMES = {"postgres", "postgresql"}
_REDIS_SCHEMES = {"redis", "rediss", "unix"}
_BROKER_SCHEMES = _REDIS_SCHEMES | {"amqp", "amqps", "pyamqp"}


def _check_url(value: str, schemes: set[str], what: str) -> str:
    try:
        parts = urlsplit(value)
    except ValueError as exc:
        raise ValueError(f"not a URL ({exc})") from None
    scheme = parts.scheme.split("+", 1)[0]
    if scheme not in schemes:
        expected = " or ".join(f"{s}://" for s in sorted(schemes))
        raise ValueError(f"{what} URL must start with {expected}, got {value!r}")
    if scheme != "unix" and not parts.hostname and "host=" not in parts.query:
        raise ValueError(f"{what} URL has no host: {value!r}")
    try:
        _ = parts.port
    except ValueError:
        raise ValueError(f"{what} URL has an invalid port: {value!r}") from None
    return value


_NEVER_BOUND = frozenset(
    [
        "/root",
        "/home",
        "/proc",
        "/sys",
        "/dev",
        "/run",
        "/var",
        "/var/run",
        "/var/lib",
        "/tmp",  # noqa: S108 - a path refused, not used
        "/etc",
    ]
)
"""Host directories no jail may show whole (``TURNKEEPER_SANDBOX_RO_BINDS``)."""
_SIZE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?)(?:I?B)?", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes from ``4294967296``, ``4G``, ``512M``, ``1.5GiB``... (powers of 1024)."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a size (bytes, or a number with K, M, G or T)")
    number, unit = match.groups()
    power = "KMGT".index(unit.upper()) + 1 if unit else 0
    return int(float(number) * 1024**power)


def split_paths(text: str) -> list[str]:
    """Paths separated by colons or commas, blanks dropped."""
    return [part.strip() for part in re.split(r"[:,]", text) if part.strip()]


_DNS_LABEL = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)")
_TOP_LABEL = re.compile(r"[a-z][a-z0-9-]*")  # never numeric, so no resolver reads it as an address
_LOOPBACK_NAMES = ("localhost", "localhost.localdomain")
DEFAULT_SANDBOX_EGRESS = ("api.anthropic.com:443", "api.openai.com:443")


def _egress_host(host: str, entry: str) -> str:
    """The one spelling of an allowlisted host; anything a resolver could read two ways fails."""
    if host.startswith("[") and host.endswith("]"):
        try:
            return f"[{ipaddress.IPv6Address(host[1:-1]).compressed}]"
        except ValueError:
            raise ValueError(f"{entry!r}: {host} is not an IPv6 address") from None
    if re.fullmatch(r"[0-9.]+", host):
        try:
            canonical = str(ipaddress.IPv4Address(host))
        except ValueError:
            raise ValueError(f"{entry!r}: {host} is not a dotted-quad IPv4 address") from None
        if canonical != host:
            raise ValueError(f"{entry!r}: write the address as {canonical}")
        return host
    labels = host.split(".")
    if (
        len(host) > 253
        or not all(_DNS_LABEL.fullmatch(label) for label in labels)
        or not _TOP_LABEL.fullmatch(labels[-1])
    ):
        raise ValueError(f"{entry!r}: {host!r} is not a host name or an IP address")
    if host in _LOOPBACK_NAMES or host.endswith(".localhost"):
        raise ValueError(f"{entry!r}: write the host's loopback as 127.0.0.1")
    return host


def _egress_entry(entry: str) -> str:
    host, colon, port = entry.strip().rpartition(":")
    if not colon or not host:
        raise ValueError(f"{entry!r} is not host:port")
    if not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        raise ValueError(f"{entry!r}: the port must be a number from 1 to 65535")
    return f"{_egress_host(host.lower().removesuffix('.'), entry)}:{int(port)}"


def parse_egress_allowlist(entries: str | Iterable[str]) -> tuple[str, ...]:
    """Canonical ``host:port`` entries of an egress allowlist (comma-separated or a sequence).

    Hosts are lowercased without a trailing dot; an IP address has exactly one accepted
    spelling, and names a resolver would read as an address (``127.1``, ``0x7f.1``) or as
    the loopback (``localhost``) are refused, so that matching stays a plain comparison.
    """
    items = entries.split(",") if isinstance(entries, str) else entries
    canonical = (_egress_entry(item) for item in items if item.strip())
    return tuple(dict.fromkeys(canonical))


def default_host_id() -> str:
    """This machine's hostname, in the characters a queue name allows. A hostname that
    had to be changed (too long, or other characters) gets a digest of itself, so two
    hosts never share a host id: each would take the other's takeovers and find its
    sandboxes lost."""
    hostname = socket.gethostname()
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", hostname)
    if name == hostname and 0 < len(name) <= 64:
        return name
    digest = hashlib.sha256(hostname.encode("utf-8", "surrogateescape")).hexdigest()[:12]
    return f"{name[:51]}-{digest}" if name else f"localhost-{digest}"


def plain_postgres_url(url: str) -> str:
    """The libpq form of a database URL (``postgresql://...``), whatever driver suffix it had."""
    scheme, rest = url.split("://", 1)
    if scheme.split("+", 1)[0] not in _POSTGRES_SCHEMES:
        raise ConfigError(f"not a PostgreSQL URL: {url!r}")
    return f"postgresql://{rest}"


def sqlalchemy_postgres_url(url: str) -> str:
    """The SQLAlchemy form of a database URL, always on the psycopg 3 driver."""
    return "postgresql+psycopg://" + plain_postgres_url(url).split("://", 1)[1]


class Settings(BaseSettings):
    """Every setting of turnkeeper. Durations are seconds; floats are allowed."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        extra="ignore",
        validate_default=True,
        frozen=True,
    )

    # Services. Unset database and Redis URLs mean: start the embedded servers.
    database_url: str | None = Field(
        default=None, description="PostgreSQL URL; plain or with a +driver suffix."
    )
    redis_url: str | None = Field(default=None, description="Redis URL of the run log.")
    broker_url: str | None = Field(
        default=None, description="Celery broker URL; defaults to the Redis URL."
    )
    data_dir: Path = Field(
        default=Path(".turnkeeper"),
        description="Embedded servers' data and the default sandbox root.",
    )
    namespace: str = Field(
        default="turnkeeper",
        pattern=r"^[A-Za-z0-9_.-]{1,64}$",
        description="Prefix of every Redis key and Celery queue, so fleets can share servers.",
    )
    host_id: str = Field(
        default_factory=default_host_id,
        pattern=r"^[A-Za-z0-9_.-]{1,64}$",
        description="The name of this worker's host: its queue, and where its sandboxes live.",
    )
    host_dead_after: float = Field(
        default=60.0,
        gt=0,
        description="A host unseen this long is dead: its sandboxes are declared lost.",
    )
    sandboxes_shared: bool = Field(
        default=False,
        description="The sandboxes dir is one filesystem every host mounts: any host may "
        "replay and follow a journal (signals still go through the sandbox's host).",
    )

    # Ownership and recovery.
    lease_ttl: float = Field(default=30.0, gt=0, description="Lease length of a run's owner.")
    heartbeat_interval: float = Field(default=10.0, gt=0, description="Lease renewal period.")
    reconcile_interval: float = Field(default=5.0, gt=0, description="Expired-lease scan period.")
    reap_interval: float = Field(default=60.0, gt=0, description="Sandbox reaping period.")
    prune_interval: float = Field(default=600.0, gt=0, description="Journal and row pruning.")
    requeue_after: float = Field(
        default=30.0, gt=0, description="Re-enqueue queued runs nobody claimed for this long."
    )
    cancel_listen: bool = Field(
        default=True,
        description="Hear a cancel the moment it commits (Postgres LISTEN on one connection "
        "per worker process); off, a cancel waits for the owner's next heartbeat (behind a "
        "transaction-mode pooler, where LISTEN does not work).",
    )
    crash_detection: bool = Field(
        default=True,
        description="Hand a run over as soon as its owner's process dies (its owner lock "
        "comes free), not only when its lease runs out.",
    )
    crash_sweep_interval: float = Field(
        default=0.5, gt=0, description="How often the crash watcher looks at owner locks."
    )
    crash_grace: float = Field(
        default=0.25,
        ge=0,
        description="How long an owner lock must stay free before its run is handed over.",
    )
    max_attempts: int = Field(default=5, ge=1, le=100, description="Attempts before failing.")
    run_timeout: float = Field(default=3600.0, gt=0, description="Deadline of a run after admit.")
    max_continuations: int = Field(
        default=3,
        ge=0,
        le=100,
        description="New agent processes a run may start after losing one, before it fails.",
    )

    # Sandboxes and journals.
    sandbox_provider: Literal["local", "bwrap", "ssh"] = Field(
        default="bwrap",
        description="Where agents run; `local` is no security boundary (see the README).",
    )
    sandbox_ro_binds: str = Field(
        default="",
        description="Extra host paths the jail shows read-only, colon- or comma-separated.",
    )
    sandbox_memory: int = Field(
        default=4 * 1024**3, gt=0, description="Memory of one sandbox, bytes or 4G, 512M..."
    )
    sandbox_disk: int = Field(
        default=4 * 1024**3,
        ge=1024 * 1024,
        description="Disk an agent may fill in its workspace, bytes or 4G, 512M... (and one "
        "file per 16 KiB of it); an agent past it is stopped and its run fails disk-limit.",
    )
    sandbox_cpus: float = Field(default=2.0, gt=0, le=1024, description="CPUs of one sandbox.")
    sandbox_pids: int = Field(default=1024, ge=16, description="Tasks of one sandbox.")
    sandbox_uids: str = Field(
        default="1900000000-1900065535",
        pattern=r"^[0-9]+-[0-9]+$",
        description="Host uids a root worker gives its sandboxes, one each: FIRST-LAST.",
    )
    sandbox_egress: Annotated[tuple[str, ...], NoDecode] = Field(
        default=DEFAULT_SANDBOX_EGRESS,
        description="host:port pairs a sandboxed agent may reach through the egress proxy, "
        "comma-separated; 127.0.0.1:PORT is the worker host's loopback; empty allows nothing.",
    )
    sandbox_root: Path | None = Field(
        default=None, description="Where local sandboxes live; defaults to DATA_DIR/sandboxes."
    )
    journal_max_bytes: int = Field(default=256 * 1024 * 1024, gt=0)
    max_line_bytes: int = Field(
        default=1024 * 1024,
        ge=4096,
        description="Longest agent output line handed on whole, bytes or 1M, 64K...; "
        "a longer line is cut into pieces of this size as it streams.",
    )
    journal_stall_timeout: float = Field(default=10.0, gt=0)
    journal_poll_interval: float = Field(default=0.25, gt=0)
    start_concurrency: int = Field(
        default=8,
        ge=1,
        le=1024,
        description="Agents one worker process starts at once; the others wait for a "
        "slot (a burst of hundreds would starve the process's own lease renewals).",
    )
    orphan_ttl: float = Field(default=3600.0, gt=0, description="Age of an unowned journal.")
    session_ttl: float = Field(
        default=24 * 3600.0,
        gt=0,
        description="How long a session's workspace is kept after its last run settled; "
        "then the reaper destroys it (the transcript stays).",
    )

    # The ssh provider's host (sandboxes live under ssh_root there).
    ssh_host: str | None = None
    ssh_port: int = Field(default=22, ge=1, le=65535)
    ssh_user: str = Field(
        default="turnkeeper",
        pattern=r"^[A-Za-z0-9_][A-Za-z0-9._-]*$",
        description="The remote user, never root by default; it must own ssh_root.",
    )
    ssh_root: str = Field(default="/var/lib/turnkeeper/sandboxes", pattern=r"^/")
    ssh_identity_file: Path | None = None
    ssh_known_hosts_file: Path | None = None
    ssh_python: str | None = Field(
        default=None,
        pattern=r"^/",
        description="The remote host's Python with turnkeeper, which runs its egress "
        "proxy; by default the worker's own interpreter path.",
    )

    # Retention.
    log_retention: float = Field(
        default=86400.0, gt=0, description="How long a closed run log stays readable."
    )
    log_max_chunks: int = Field(default=1_000_000, gt=0, description="Trim bound of one log.")
    settled_retention: float = Field(
        default=7 * 86400.0, gt=0, description="How long settled runs keep segments and slots."
    )

    # The server secret: every keyed value (stream tokens, sealed env values) derives from it.
    secret: SecretStr | None = Field(
        default=None, description=f"Server secret, at least {MIN_SECRET_BYTES} bytes."
    )
    secret_file: Path | None = Field(default=None, description="A file holding the secret.")

    # Web.
    web_host: str = "127.0.0.1"
    web_port: int = Field(default=8000, ge=0, le=65535)
    stream_token_ttl: float = Field(default=3600.0, gt=0)
    allowed_hosts: str = Field(
        default="localhost,127.0.0.1,[::1]",
        description="Comma-separated Host header values the web app answers ('*.d' matches "
        "subdomains of d, '*' any host).",
    )
    max_body_bytes: int = Field(default=1024 * 1024, gt=0, description="Request body limit.")
    agents_file: Path | None = Field(
        default=None, description="The operator's agent catalog (TOML) for HTTP submissions."
    )
    submit_rate: float = Field(
        default=60.0, gt=0, description="Submissions per minute per API key (sustained)."
    )
    submit_burst: int = Field(default=20, ge=1, description="Submissions per API key at once.")
    max_streams_per_key: int = Field(
        default=64, ge=1, description="Open event streams per API key, across web processes."
    )

    # Embedded servers (0: pick a free port on first start, then keep it).
    embedded_postgres_port: int = Field(default=0, ge=0, le=65535)
    embedded_redis_port: int = Field(default=0, ge=0, le=65535)

    # Testing only: named points where a worker stops, to be killed there, or fails
    # (``point=mode``; see workers/failpoints.py).
    failpoints: str = Field(default="", pattern=r"^[a-z0-9,=-]*$")

    # Logging.
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_format: Literal["auto", "json", "console"] = "auto"

    @field_validator("sandbox_memory", "sandbox_disk", "max_line_bytes", mode="before")
    @classmethod
    def _size(cls, value: object) -> object:
        return parse_size(value) if isinstance(value, str) else value

    @field_validator("sandbox_ro_binds")
    @classmethod
    def _ro_binds(cls, value: str) -> str:
        paths = split_paths(value)
        for path in paths:
            if not path.startswith("/") or path == "/":
                raise ValueError(f"{path!r} is not an absolute path below /")
            if any(part in (".", "..") for part in path.split("/")) or "\n" in path:
                raise ValueError(f"{path!r} is not a normalized path")
            if path.rstrip("/") in _NEVER_BOUND:
                raise ValueError(f"{path} would show the host's {path} to every agent")
        return ",".join(paths)

    @field_validator("sandbox_uids")
    @classmethod
    def _uids(cls, value: str) -> str:
        first, last = (int(n) for n in value.split("-"))
        if not 1000 <= first <= last < 2**32 - 1:
            raise ValueError(f"{value!r} is not a range of unprivileged uids (FIRST-LAST, >= 1000)")
        return value

    @field_validator("database_url")
    @classmethod
    def _database_url(cls, value: str | None) -> str | None:
        return None if not value else _check_url(value, _POSTGRES_SCHEMES, "database")

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: str | None) -> str | None:
        return None if not value else _check_url(value, _REDIS_SCHEMES, "Redis")

    @field_validator("broker_url")
    @classmethod
    def _broker_url(cls, value: str | None) -> str | None:
        return None if not value else _check_url(value, _BROKER_SCHEMES, "broker")

    @field_validator("sandbox_egress", mode="before")
    @classmethod
    def _sandbox_egress(cls, value: object) -> tuple[str, ...]:
        if not isinstance(value, str | list | tuple):
            raise ValueError("expected comma-separated host:port entries")  # noqa: TRY004 - pydantic reports ValueErrors
        return parse_egress_allowlist(value)

    @field_validator("secret")
    @classmethod
    def _secret(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value():
            return None
        if len(value.get_secret_value().encode()) < MIN_SECRET_BYTES:
            raise ValueError(f"must be at least {MIN_SECRET_BYTES} bytes")
        return value

    @field_validator("allowed_hosts")
    @classmethod
    def _allowed_hosts(cls, value: str) -> str:
        for host in (h.strip() for h in value.split(",")):
            if not host:
                raise ValueError("an empty host name in the list")
            if "*" in host[1:] or (host.startswith("*") and host != "*" and host[:2] != "*."):
                raise ValueError(f"a wildcard must look like '*.example.com', got {host!r}")
        return value

    @model_validator(mode="after")
    def _intervals(self) -> Self:
        if self.heartbeat_interval >= self.lease_ttl:
            raise ValueError(
                f"{ENV_PREFIX}HEARTBEAT_INTERVAL ({self.heartbeat_interval}s) must be shorter "
                f"than {ENV_PREFIX}LEASE_TTL ({self.lease_ttl}s), or every owner loses its lease"
            )
        return self

    @model_validator(mode="after")
    def _binds_hide_the_fleet(self) -> Self:
        """No read-only bind may show agents the data dir or the sandboxes (journals,
        other runs' workspaces), nor sit inside them."""
        fleet = [self.data_dir.resolve(), self.sandboxes_dir.resolve()]
        for path in map(Path, self.ro_bind_paths):
            for kept in fleet:
                if kept.is_relative_to(path) or path.is_relative_to(kept):
                    raise ValueError(
                        f"{ENV_PREFIX}SANDBOX_RO_BINDS: {path} would show {kept} to every agent"
                    )
        return self

    @property
    def uses_embedded(self) -> bool:
        """True when the database or Redis URL is unset and the embedded servers stand in."""
        return self.database_url is None or self.redis_url is None

    @property
    def ro_bind_paths(self) -> tuple[str, ...]:
        return tuple(split_paths(self.sandbox_ro_binds))

    @property
    def sandbox_uid_range(self) -> tuple[int, int]:
        first, last = (int(n) for n in self.sandbox_uids.split("-"))
        return first, last

    @property
    def trusted_hosts(self) -> list[str]:
        return [host.strip().lower() for host in self.allowed_hosts.split(",")]

    @property
    def host_beacon_interval(self) -> float:
        """How often a worker process says its host is alive: often enough that a host
        is never thought dead while one of its workers runs."""
        return min(self.heartbeat_interval, self.host_dead_after / 4)

    @property
    def sandboxes_dir(self) -> Path:
        return self.sandbox_root or self.data_dir / "sandboxes"

    def with_services(self, *, database_url: str, redis_url: str) -> Settings:
        """A copy pointing at concrete servers (the embedded ones, typically)."""
        return self.model_copy(update={"database_url": database_url, "redis_url": redis_url})

    def require_database_url(self) -> str:
        if self.database_url is None:
            raise ConfigError("TURNKEEPER_DATABASE_URL is not set and no embedded server runs")
        return self.database_url

    def require_redis_url(self) -> str:
        if self.redis_url is None:
            raise ConfigError("TURNKEEPER_REDIS_URL is not set and no embedded server runs")
        return self.redis_url

    @property
    def effective_broker_url(self) -> str:
        return self.broker_url or self.require_redis_url()


def load_settings(**overrides: object) -> Settings:
    """Read the settings, turning validation failures into one-line ConfigErrors."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            message = str(error["msg"]).removeprefix("Value error, ")
            if error["loc"]:
                name = "_".join(str(part) for part in error["loc"]).upper()
                message = f"{ENV_PREFIX}{name}: {message}"
            problems.append(message)
        raise ConfigError("; ".join(problems), reason="invalid-settings") from None
