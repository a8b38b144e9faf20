"""Providers are built from the settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from turnkeeper.config import Settings
from turnkeeper.errors import ConfigError
from turnkeeper.sandbox import provider_for
from turnkeeper.sandbox.bwrap import BwrapProvider
from turnkeeper.sandbox.factory import at_least_as_strong
from turnkeeper.sandbox.local import LocalProvider
from turnkeeper.sandbox.ssh import SshProvider


def test_local_and_bwrap_live_under_the_sandboxes_dir(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path)
    local = provider_for("local", settings)
    assert isinstance(local, LocalProvider)
    assert local.root == (tmp_path / "sandboxes").resolve()
    assert isinstance(provider_for("bwrap", settings), BwrapProvider)


def test_ssh_is_reached_through_the_settings(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path,
        ssh_host="sandbox-host",
        ssh_port=2222,
        ssh_user="agent",
        ssh_root="/srv/sandboxes",
        ssh_identity_file=tmp_path / "id",
    )
    provider = provider_for("ssh", settings)
    assert isinstance(provider, SshProvider)
    target = provider.target
    assert (target.host, target.port, target.user, target.root) == (
        "sandbox-host",
        2222,
        "agent",
        "/srv/sandboxes",
    )
    assert target.identity_file == tmp_path / "id"


def test_ssh_without_a_host_and_unknown_providers_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="TURNKEEPER_SSH_HOST"):
        provider_for("ssh", Settings(data_dir=tmp_path))
    with pytest.raises(ConfigError, match="unknown sandbox provider"):
        provider_for("vm", Settings(data_dir=tmp_path))


def test_providers_are_ranked_by_what_they_isolate() -> None:
    ranked = ["local", "ssh", "bwrap"]
    allowed = {
        (asked, configured)
        for asked in ranked
        for configured in ranked
        if at_least_as_strong(asked, configured)
    }
    assert allowed == {
        ("local", "local"), ("ssh", "local"), ("bwrap", "local"),
        ("ssh", "ssh"), ("bwrap", "ssh"),
        ("bwrap", "bwrap"),
    }  # fmt: skip
    assert not at_least_as_strong("docker", "local")  # unknown: never stronger
