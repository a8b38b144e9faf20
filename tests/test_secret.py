"""The server secret: subkeys per label, the dev secret file, sealed env values."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import SecretStr

from turnkeeper.config import Settings
from turnkeeper.envelope import EnvSealer
from turnkeeper.errors import AgentError, ConfigError
from turnkeeper.secret import (
    ENV_DIGEST,
    ENV_SEALING,
    STREAM_TOKENS,
    ServerSecret,
    ensure_dev_secret,
)

MATERIAL = b"k" * 32
LABELS = (STREAM_TOKENS, ENV_SEALING, ENV_DIGEST)


def test_each_use_has_its_own_subkey_and_none_is_the_secret() -> None:
    secret = ServerSecret(MATERIAL)
    keys = [secret.subkey(label) for label in LABELS]
    assert len(set(keys)) == len(LABELS)
    assert MATERIAL not in keys
    assert keys == [ServerSecret(MATERIAL).subkey(label) for label in LABELS]  # derived, not random
    assert ServerSecret(b"j" * 32).subkey(STREAM_TOKENS) != keys[0]
    assert "k" * 32 not in repr(secret)


def test_a_secret_is_at_least_32_bytes_from_the_value_or_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="at least 32 bytes"):
        ServerSecret(b"x" * 31)
    short = tmp_path / "short"
    short.write_text("x" * 31 + "\n")
    with pytest.raises(ConfigError, match=r"SECRET_FILE: .* holds 31 bytes"):
        ServerSecret.from_settings(Settings(secret_file=short))
    with pytest.raises(ConfigError, match="cannot read"):
        ServerSecret.from_settings(Settings(secret_file=tmp_path / "missing"))
    good = tmp_path / "good"
    good.write_text("y" * 40 + "\n")  # the newline is not part of it
    from_file = ServerSecret.from_settings(Settings(secret_file=good))
    from_value = ServerSecret.from_settings(Settings(secret=SecretStr("y" * 40)))
    assert from_file is not None
    assert from_value is not None
    assert from_file.subkey(STREAM_TOKENS) == from_value.subkey(STREAM_TOKENS)
    assert ServerSecret.from_settings(Settings()) is None
    with pytest.raises(ConfigError, match=r"TURNKEEPER_SECRET .* must be set to start"):
        ServerSecret.require(Settings(), "to start")


def test_the_dev_secret_is_made_once_private_and_shared(tmp_path: Path) -> None:
    path = ensure_dev_secret(tmp_path / "data")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    first = path.read_bytes()
    assert ensure_dev_secret(tmp_path / "data") == path
    assert path.read_bytes() == first
    assert len(first.strip()) >= 32
    assert path.stat().st_uid == os.getuid()


def test_sealed_env_opens_only_for_its_run_under_its_secret() -> None:
    sealer = EnvSealer(ServerSecret(MATERIAL))
    env = {"ANTHROPIC_API_KEY": "sk-ant-plaintext", "EMPTY": ""}
    sealed = sealer.seal("run 1", env)
    assert "sk-ant-plaintext" not in str(sealed)
    assert sealer.open("run 1", sealed) == env
    again = sealer.seal("run 1", env)
    assert again["sealed"] != sealed["sealed"]  # a fresh nonce every time
    assert again["digest"] == sealed["digest"]  # what idempotency compares
    assert sealer.seal("run 2", env)["digest"] != sealed["digest"]
    refusals = {
        "another run": ("run 2", sealed),
        "another secret": ("run 1", EnvSealer(ServerSecret(b"j" * 32)).seal("run 1", env)),
        "tampered": ("run 1", {**sealed, "sealed": sealed["sealed"][:-4] + "AAAA"}),
        "another version": ("run 1", {**sealed, "sealed": "v9" + sealed["sealed"][2:]}),
        "not base64": ("run 1", {"sealed": "v1.***"}),
    }
    for name, (run_id, field) in refusals.items():
        with pytest.raises(AgentError) as caught:
            EnvSealer(ServerSecret(MATERIAL)).open(run_id, field)
        assert caught.value.reason == "env-unreadable", name
    with pytest.raises(AgentError) as gone:
        sealer.open("run 1", {"digest": sealed["digest"]})
    assert gone.value.reason == "env-gone"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl is Linux's")
def test_fleet_processes_make_themselves_undumpable() -> None:
    script = (
        "import ctypes; from turnkeeper.secret import make_undumpable; "
        "libc = ctypes.CDLL(None); before = libc.prctl(3, 0, 0, 0, 0); make_undumpable(); "
        "print(before, libc.prctl(3, 0, 0, 0, 0))"  # 3 is PR_GET_DUMPABLE
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.split() == ["1", "0"]
