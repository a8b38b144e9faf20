"""Settings: defaults, environment, URL forms, and one-line errors for bad input."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

from turnkeeper.config import (
    Settings,
    default_host_id,
    load_settings,
    plain_postgres_url,
    sqlalchemy_postgres_url,
)
from turnkeeper.errors import ConfigError, TurnkeeperError


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DATABASE_URL", "REDIS_URL", "BROKER_URL", "DATA_DIR", "LEASE_TTL"):
        monkeypatch.delenv(f"TURNKEEPER_{name}", raising=False)


def test_defaults_are_sane() -> None:
    settings = load_settings()
    assert settings.database_url is None
    assert settings.redis_url is None
    assert settings.uses_embedded
    assert settings.data_dir == Path(".turnkeeper")
    assert settings.sandboxes_dir == Path(".turnkeeper/sandboxes")
    assert settings.heartbeat_interval < settings.lease_ttl
    assert settings.secret is None


def test_reads_prefixed_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TURNKEEPER_DATABASE_URL", "postgresql://u@db:5433/app")
    monkeypatch.setenv("TURNKEEPER_REDIS_URL", "redis://cache:6380/2")
    monkeypatch.setenv("TURNKEEPER_LEASE_TTL", "2.5")
    monkeypatch.setenv("TURNKEEPER_HEARTBEAT_INTERVAL", "0.5")
    monkeypatch.setenv("TURNKEEPER_SECRET", "s3cret-" + "x" * 25)
    settings = load_settings()
    assert settings.database_url == "postgresql://u@db:5433/app"
    assert settings.lease_ttl == 2.5
    assert settings.heartbeat_interval == 0.5
    assert not settings.uses_embedded
    assert settings.effective_broker_url == "redis://cache:6380/2"
    assert settings.secret is not None
    assert settings.secret.get_secret_value() == "s3cret-" + "x" * 25
    assert "s3cret" not in repr(settings)


def test_a_short_secret_is_a_one_line_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TURNKEEPER_SECRET", "x" * 31)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert caught.value.message == "TURNKEEPER_SECRET: must be at least 32 bytes"


def test_broker_url_overrides_redis() -> None:
    settings = Settings(redis_url="redis://r:6379/0", broker_url="amqp://guest:guest@mq:5672//")
    assert settings.effective_broker_url == "amqp://guest:guest@mq:5672//"


@pytest.mark.parametrize(
    ("given", "plain", "alchemy"),
    [
        ("postgresql://u@h:5432/d", "postgresql://u@h:5432/d", "postgresql+psycopg://u@h:5432/d"),
        ("postgres://u@h/d", "postgresql://u@h/d", "postgresql+psycopg://u@h/d"),
        ("postgresql+psycopg://u@h/d", "postgresql://u@h/d", "postgresql+psycopg://u@h/d"),
        ("postgresql+psycopg2://u:p@h/d", "postgresql://u:p@h/d", "postgresql+psycopg://u:p@h/d"),
    ],
)
def test_database_url_forms(given: str, plain: str, alchemy: str) -> None:
    assert Settings(database_url=given).database_url == given
    assert plain_postgres_url(given) == plain
    assert sqlalchemy_postgres_url(given) == alchemy


@pytest.mark.parametrize(
    ("overrides", "names"),
    [
        ({"database_url": "mysql://u@h/d"}, "TURNKEEPER_DATABASE_URL"),
        ({"database_url": "postgresql:///nohost"}, "TURNKEEPER_DATABASE_URL"),
        ({"database_url": "postgresql://h:notaport/d"}, "TURNKEEPER_DATABASE_URL"),
        ({"redis_url": "http://h:6379"}, "TURNKEEPER_REDIS_URL"),
        ({"broker_url": "kafka://h"}, "TURNKEEPER_BROKER_URL"),
        ({"lease_ttl": -1}, "TURNKEEPER_LEASE_TTL"),
        ({"lease_ttl": 5, "heartbeat_interval": 5}, "TURNKEEPER_HEARTBEAT_INTERVAL"),
        ({"namespace": "has space"}, "TURNKEEPER_NAMESPACE"),
        ({"max_attempts": 0}, "TURNKEEPER_MAX_ATTEMPTS"),
        ({"sandbox_provider": "vm"}, "TURNKEEPER_SANDBOX_PROVIDER"),
    ],
)
def test_bad_settings_name_the_variable(overrides: dict[str, object], names: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(**overrides)
    assert names in caught.value.message
    assert "\n" not in str(caught.value)
    assert isinstance(caught.value, TurnkeeperError)


def test_require_urls_explain_what_to_do() -> None:
    with pytest.raises(ConfigError, match="TURNKEEPER_DATABASE_URL"):
        Settings().require_database_url()
    with pytest.raises(ConfigError, match="TURNKEEPER_REDIS_URL"):
        Settings().require_redis_url()


def test_errors_carry_structured_fields() -> None:
    error = TurnkeeperError("lost", run_id="r1", attempt_id="a1", epoch=3, reason="lease")
    assert error.context() == {"run_id": "r1", "attempt_id": "a1", "epoch": 3, "reason": "lease"}
    assert str(error) == "lost (run_id='r1', attempt_id='a1', epoch=3, reason='lease')"
    assert str(ConfigError()) == "A setting is missing or invalid."


def test_sandbox_egress_defaults_to_the_model_apis(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TURNKEEPER_SANDBOX_EGRESS", raising=False)
    assert load_settings().sandbox_egress == ("api.anthropic.com:443", "api.openai.com:443")


@pytest.mark.parametrize(
    ("given", "canonical"),
    [
        ("", ()),
        (" , ", ()),
        ("API.Anthropic.COM.:443", ("api.anthropic.com:443",)),
        (
            "127.0.0.1:8080, example.org:0443,[0:0::1]:9, xn--bcher-kva.example:80",
            ("127.0.0.1:8080", "example.org:443", "[::1]:9", "xn--bcher-kva.example:80"),
        ),
        ("a.example:1,a.example:1,A.example.:1", ("a.example:1",)),
    ],
)
def test_sandbox_egress_is_read_comma_separated_into_canonical_entries(
    monkeypatch: pytest.MonkeyPatch, given: str, canonical: tuple[str, ...]
) -> None:
    monkeypatch.setenv("TURNKEEPER_SANDBOX_EGRESS", given)
    assert load_settings().sandbox_egress == canonical
    assert Settings(sandbox_egress=given).sandbox_egress == canonical
    assert Settings(sandbox_egress=list(given.split(","))).sandbox_egress == canonical


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        ("api.anthropic.com", "is not host:port"),
        (":443", "is not host:port"),
        ("api.anthropic.com:0", "the port must be a number from 1 to 65535"),
        ("api.anthropic.com:65536", "the port must be a number from 1 to 65535"),
        ("api.anthropic.com:https", "the port must be a number from 1 to 65535"),
        ("localhost:8080", "write the host's loopback as 127.0.0.1"),
        ("app.localhost:8080", "write the host's loopback as 127.0.0.1"),
        ("127.1:8080", "127.1 is not a dotted-quad IPv4 address"),
        ("2130706433:8080", "2130706433 is not a dotted-quad IPv4 address"),
        ("127.000.000.001:8080", "127.000.000.001 is not a dotted-quad IPv4 address"),
        ("0x7f.1:8080", "'0x7f.1' is not a host name or an IP address"),
        ("*.anthropic.com:443", "'*.anthropic.com' is not a host name or an IP address"),
        ("api.example.123:443", "'api.example.123' is not a host name or an IP address"),
        ("bad_name.example:443", "'bad_name.example' is not a host name or an IP address"),
        ("[::g]:443", "[::g] is not an IPv6 address"),
        ("::1:443", "'::1' is not a host name or an IP address"),
        ("user@api.anthropic.com:443", "is not a host name or an IP address"),
    ],
)
def test_a_bad_sandbox_egress_entry_is_one_line_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch, entry: str, why: str
) -> None:
    monkeypatch.setenv("TURNKEEPER_SANDBOX_EGRESS", f"api.openai.com:443,{entry}")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    message = caught.value.message
    assert message.startswith(f"TURNKEEPER_SANDBOX_EGRESS: {entry!r}"), message
    assert why in message
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    ("binds", "needle"),
    [
        ("relative/dir", "is not an absolute path"),
        ("/", "is not an absolute path below /"),
        ("/opt/../root", "is not a normalized path"),
        ("/root", "would show the host's /root"),
        ("/home/", "would show the host's /home/"),
        ("/run", "would show the host's /run"),
        ("/srv/tk", "would show /srv/tk/data to every agent"),
        ("/srv/tk/data/sandboxes/x", "would show /srv/tk/data to every agent"),
    ],
)
def test_read_only_binds_never_show_the_fleet(binds: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        load_settings(sandbox_ro_binds=binds, data_dir="/srv/tk/data")


def test_sandbox_settings_parse_sizes_and_lists() -> None:
    settings = load_settings(
        sandbox_memory="1.5G",
        sandbox_ro_binds="/opt/a:/usr/share/b, /srv/c",
        sandbox_uids="5000-5009",
    )
    assert settings.sandbox_memory == 1536 * 1024 * 1024
    assert settings.ro_bind_paths == ("/opt/a", "/usr/share/b", "/srv/c")
    assert settings.sandbox_uid_range == (5000, 5009)
    assert (settings.sandbox_provider, settings.sandbox_cpus, settings.sandbox_pids) == (
        "bwrap",
        2.0,
        1024,
    )
    assert load_settings().sandbox_memory == 4 * 1024**3
    for bad, needle in (
        ({"sandbox_memory": "4X"}, "TURNKEEPER_SANDBOX_MEMORY: '4X' is not a size"),
        ({"sandbox_uids": "9-3"}, "TURNKEEPER_SANDBOX_UIDS"),
        ({"sandbox_uids": "0-99"}, "TURNKEEPER_SANDBOX_UIDS"),
        ({"sandbox_pids": 3}, "TURNKEEPER_SANDBOX_PIDS"),
    ):
        with pytest.raises(ConfigError, match=needle):
            load_settings(**bad)


def test_the_disk_limit_is_a_size_of_at_least_a_mebibyte() -> None:
    """``TURNKEEPER_SANDBOX_DISK`` reads like the memory limit; 4 GiB by default."""
    assert load_settings().sandbox_disk == 4 * 1024**3
    assert load_settings(sandbox_disk="512M").sandbox_disk == 512 * 1024**2
    assert load_settings(sandbox_disk="1.5GiB").sandbox_disk == 1536 * 1024**2
    assert load_settings(sandbox_disk=str(2**40)).sandbox_disk == 2**40
    for bad, needle in (
        ("4X", "TURNKEEPER_SANDBOX_DISK: '4X' is not a size"),
        ("512K", "TURNKEEPER_SANDBOX_DISK: .*greater than or equal to 1048576"),
        ("0", "TURNKEEPER_SANDBOX_DISK"),
    ):
        with pytest.raises(ConfigError, match=needle):
            load_settings(sandbox_disk=bad)


@pytest.mark.parametrize(
    ("hostnames", "why"),
    [
        (("worker-" + "x" * 60 + "-1", "worker-" + "x" * 60 + "-2"), "past 64 characters"),
        (("web+1", "web-1"), "a character a queue name refuses"),
        (("wéb", "wèb"), "letters a queue name refuses"),
    ],
)
def test_distinct_hostnames_make_distinct_host_ids(
    monkeypatch: pytest.MonkeyPatch, hostnames: tuple[str, str], why: str
) -> None:
    """Two hosts sharing one host id would each take the other's takeovers and find
    its sandboxes lost: the default host id keeps hostnames apart, valid as queue names."""
    ids = []
    for name in hostnames:
        monkeypatch.setattr(socket, "gethostname", lambda name=name: name)
        host_id = default_host_id()
        assert re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", host_id), host_id
        ids.append(host_id)
    assert ids[0] != ids[1], why
    monkeypatch.setattr(socket, "gethostname", lambda: "web-1.internal")
    assert default_host_id() == "web-1.internal", "a valid hostname is kept as it is"
