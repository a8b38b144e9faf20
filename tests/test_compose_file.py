"""docker/compose.yaml against the code: settings it sets exist, the ssh provider it
configures can be built (with its egress allowlist), the web port stays on the loopback.

scripts/compose-check runs the stack for real (minutes, outside CI); these catch a
renamed setting or command here, in a second.
"""

from __future__ import annotations

import json
import re
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from turnkeeper.config import ENV_PREFIX, Settings, load_settings
from turnkeeper.sandbox.factory import provider_for
from turnkeeper.sandbox.ssh import SshProvider

COMPOSE = Path(__file__).resolve().parent.parent / "docker" / "compose.yaml"
DOCKERFILE = COMPOSE.with_name("Dockerfile")
_VARIABLE = re.compile(r"\$\{(?P<name>\w+)(?::-(?P<default>[^}]*)|:\?[^}]*)?\}")


def _interpolated(value: str) -> str:
    """A compose value with every ``${VAR...}`` replaced by its default (or ``x``)."""
    return _VARIABLE.sub(lambda m: m["default"] if m["default"] is not None else "x", value)


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return loaded["services"]  # type: ignore[no-any-return]


def _environment(service: dict[str, Any]) -> dict[str, str]:
    return {k: _interpolated(str(v)) for k, v in (service.get("environment") or {}).items()}


def test_every_turnkeeper_variable_is_a_setting(services: dict[str, Any]) -> None:
    known = {f"{ENV_PREFIX}{name.upper()}" for name in Settings.model_fields}
    for name, service in services.items():
        unknown = {
            key for key in _environment(service) if key.startswith(ENV_PREFIX) and key not in known
        }
        assert unknown == set(), name


@pytest.mark.parametrize("role", ["worker", "beat"])
def test_fleet_settings_build_the_ssh_provider_of_the_sandbox_host(
    services: dict[str, Any], role: str
) -> None:
    env = _environment(services[role])
    settings = load_settings(
        **{k.removeprefix(ENV_PREFIX).lower(): v for k, v in env.items()},
    )
    provider = provider_for(settings.sandbox_provider, settings)
    assert isinstance(provider, SshProvider)
    target = provider.target
    assert (target.host, target.port, target.user) == ("sandbox-host", 2222, "agent")
    assert env["TURNKEEPER_SSH_USER"] == "agent"  # set here, whatever the default is
    # The sandbox host's jails reach only the allowlist, through the proxy the workers
    # start there, in egress/ beside the sandbox root (a directory its image gives `agent`).
    assert provider.egress == ("api.anthropic.com:443",)
    egress_dir = f"{PurePosixPath(target.root).parent}/egress"
    assert f"install -d -o 10002 -g 10002 -m 0711 {egress_dir}\n" in DOCKERFILE.read_text()
    assert target.strict_host_key_checking
    assert target.known_hosts_file == Path("/etc/turnkeeper/sandbox-host-public/known_hosts")
    assert target.identity_file == Path("/etc/turnkeeper/ssh/id_ed25519")
    # The identity and known_hosts volumes are mounted where the settings look for them.
    mounts = [volume.split(":") for volume in services[role]["volumes"]]
    assert ["worker-ssh", "/etc/turnkeeper/ssh", "ro"] in mounts
    assert ["sandbox-host-public", "/etc/turnkeeper/sandbox-host-public", "ro"] in mounts
    provider.close()


def test_web_is_published_on_the_loopback_only(services: dict[str, Any]) -> None:
    published = [_interpolated(port) for port in services["web"]["ports"]]
    assert published == ["127.0.0.1:8000:8000"]
    others = [name for name, service in services.items() if name != "web" and "ports" in service]
    assert others == []


def test_the_sandbox_host_cannot_reach_the_backend(services: dict[str, Any]) -> None:
    loaded = yaml.safe_load(COMPOSE.read_text())
    assert loaded["networks"]["backend"] == {"internal": True}
    assert services["sandbox-host"]["networks"] == ["sandbox"]
    for name in ("postgres", "redis"):
        assert services[name]["networks"] == ["backend"], name


def test_sandbox_host_runs_unprivileged(services: dict[str, Any]) -> None:
    host = services["sandbox-host"]
    assert host["cap_drop"] == ["ALL"]
    assert "cap_add" not in host
    assert "privileged" not in host
    assert set(host["security_opt"]) == {
        "no-new-privileges",
        "unmask=/proc/*",
        "seccomp=./sandbox-host-seccomp.json",
    }


def test_the_sandbox_hosts_seccomp_profile_adds_only_the_jails_hostname() -> None:
    """Default deny; sethostname and setdomainname allowed without CAP_SYS_ADMIN (bwrap
    names the jail's own UTS namespace); every capability-gated rule otherwise intact."""
    profile = json.loads(COMPOSE.with_name("sandbox-host-seccomp.json").read_text())
    assert profile["defaultAction"] == "SCMP_ACT_ERRNO"
    rules = profile["syscalls"]
    unconditional = {
        name
        for rule in rules
        if rule["action"] == "SCMP_ACT_ALLOW"
        and not rule.get("includes")
        and not rule.get("args")
        and not rule.get("excludes")
        for name in rule["names"]
    }
    assert {"sethostname", "setdomainname", "unshare", "mount", "pivot_root"} <= unconditional
    gated = {
        name: rule["includes"]["caps"]
        for rule in rules
        if rule["action"] == "SCMP_ACT_ALLOW" and rule.get("includes", {}).get("caps")
        for name in rule["names"]
    }
    assert gated["setns"] == gated["bpf"] == ["CAP_SYS_ADMIN"]
    assert "sethostname" not in gated
