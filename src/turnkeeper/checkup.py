"""Health checks of the services turnkeeper needs, shared by `turnkeeper doctor` and the web
app, and of the catalog's agents (`turnkeeper.agents.readiness`), for `doctor`."""

from __future__ import annotations

from dataclasses import dataclass

from turnkeeper.config import Settings, plain_postgres_url
from turnkeeper.store import migration

_TIMEOUT = 3.0


@dataclass(frozen=True)
class CheckResult:
    name: str
    ok: bool
    target: str
    detail: str
    informational: bool = False
    """Reported, never failed: a preset nobody set up."""


def redact(url: str) -> str:
    """A URL without its password, for printing."""
    from sqlalchemy.engine import make_url  # noqa: PLC0415 - keeps `--help` fast

    try:
        parsed = make_url(url)
    except Exception:  # noqa: BLE001 - any unparsable URL is shown as a placeholder
        return "<unparsable url>"
    if parsed.password is None:
        return url
    return parsed.render_as_string(hide_password=True)


def check_database(settings: Settings) -> CheckResult:
    import psycopg  # noqa: PLC0415 - keeps `--help` fast

    url = settings.database_url
    if url is None:
        return CheckResult("database", ok=False, target="-", detail="no URL configured")
    target = redact(url)
    try:
        with psycopg.connect(plain_postgres_url(url), connect_timeout=int(_TIMEOUT)) as conn:
            row = conn.execute("SHOW server_version").fetchone()
        version = str(row[0]).split()[0] if row else "?"
        current, head = migration.current_revision(url), migration.head_revision()
    except Exception as exc:  # noqa: BLE001 - every failure is a failed check, reported in one line
        return CheckResult("database", ok=False, target=target, detail=_one_line(exc))
    if current != head:
        return CheckResult(
            "database",
            ok=False,
            target=target,
            detail=f"PostgreSQL {version}, schema at {current or 'none'}, head is {head}: "
            "run `turnkeeper db upgrade`",
        )
    return CheckResult(
        "database", ok=True, target=target, detail=f"PostgreSQL {version}, schema at head ({head})"
    )


def check_redis(settings: Settings) -> CheckResult:
    import redis  # noqa: PLC0415 - keeps `--help` fast

    url = settings.redis_url
    if url is None:
        return CheckResult("redis", ok=False, target="-", detail="no URL configured")
    client = redis.Redis.from_url(url, socket_timeout=_TIMEOUT, socket_connect_timeout=_TIMEOUT)
    try:
        info = client.info("server")
    except Exception as exc:  # noqa: BLE001 - every failure is a failed check, reported in one line
        return CheckResult("redis", ok=False, target=redact(url), detail=_one_line(exc))
    finally:
        client.close()
    return CheckResult(
        "redis", ok=True, target=redact(url), detail=f"Redis {info.get('redis_version', '?')}"
    )


def check_broker(settings: Settings) -> CheckResult:
    from kombu import Connection  # noqa: PLC0415 - keeps `--help` fast

    url = settings.broker_url or settings.redis_url
    if url is None:
        return CheckResult("broker", ok=False, target="-", detail="no URL configured")
    try:
        with Connection(url, connect_timeout=_TIMEOUT) as conn:
            conn.ensure_connection(max_retries=1, timeout=int(_TIMEOUT))
            transport = conn.transport_cls
    except Exception as exc:  # noqa: BLE001 - every failure is a failed check, reported in one line
        return CheckResult("broker", ok=False, target=redact(url), detail=_one_line(exc))
    return CheckResult("broker", ok=True, target=redact(url), detail=f"reachable ({transport})")


def run_checks(settings: Settings) -> list[CheckResult]:
    return [check_database(settings), check_redis(settings), check_broker(settings)]


def check_agents(settings: Settings) -> list[CheckResult]:
    """A line per agent that is ready or not set up, and one per problem of the others."""
    from turnkeeper.agents import readiness  # noqa: PLC0415 - keeps `--help` fast

    results = []
    for report in readiness.check_agents(settings):
        if report.problems:
            results += [CheckResult("agent", False, report.agent, p) for p in report.problems]
        else:
            informational = not report.configured
            results.append(CheckResult("agent", True, report.agent, report.found, informational))
    return results


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else 'no detail'}"
