"""How a prompt reaches an agent, on every provider: byte-exact, at any size up to 1 MiB,
never read as an option, and never on an argv of anything but the agent itself."""

from __future__ import annotations

import hashlib
import secrets
import time
from pathlib import Path

import psutil
import pytest

from turnkeeper.agents.spec import AgentSpec
from turnkeeper.errors import SandboxError
from turnkeeper.sandbox import (
    PROMPT,
    PROMPT_FILE,
    AgentCommand,
    JournalReader,
    Sandbox,
    SandboxProvider,
    SandboxSpec,
    list_journals,
    spawn_journaled,
)
from turnkeeper.sandbox.command import MAX_ARGUMENT_BYTES

MIB = 1024 * 1024
DIGEST = "import hashlib, sys; d = {read}; print(len(d), hashlib.sha256(d).hexdigest())"
FROM_FILE = DIGEST.format(read="open(sys.argv[1], 'rb').read()")
FROM_STDIN = DIGEST.format(read="sys.stdin.buffer.read()")
FROM_ARGUMENT = DIGEST.format(read="sys.argv[1].encode()")
ECHO_ENV = DIGEST.format(read="__import__('os').environb[b'BIG']")
# Command-line shapes of the real CLIs, parsed the way they parse (argparse here): an
# argument that starts with "-" is an option to them unless it follows "--".
FAKE_CLAUDE = """#!/usr/bin/python3
import argparse, sys
p = argparse.ArgumentParser()
p.add_argument("-p", "--print", action="store_true")
p.add_argument("--output-format"); p.add_argument("--verbose", action="store_true")
p.add_argument("--include-partial-messages", action="store_true"); p.add_argument("--resume")
p.add_argument("--permission-mode")
p.add_argument("prompt", nargs="?")
a = p.parse_args()
prompt = a.prompt if a.prompt is not None else sys.stdin.read()
print(repr(["claude", a.print, a.output_format, a.resume, prompt]))
"""
FAKE_CODEX = """#!/usr/bin/python3
import argparse, sys
p = argparse.ArgumentParser()
sub = p.add_subparsers(dest="cmd")
e = sub.add_parser("exec")
e.add_argument("--json", action="store_true")
e.add_argument("--skip-git-repo-check", action="store_true")
e.add_argument("--dangerously-bypass-approvals-and-sandbox", action="store_true")
e.add_argument("words", nargs="*")
a = p.parse_args()
words = a.words
prompt = words[-1] if words else "-"
if prompt == "-":
    prompt = sys.stdin.read()
print(repr(["codex", a.cmd, a.json, words[:-1], prompt]))
"""
HOSTILE_PROMPT = "--help -rf --output-format=text\n-- $(touch pwned) `id` 'quoted' \"x\"\n\n"


def _read(sandbox: Sandbox, command: AgentCommand, prompt: bytes) -> tuple[list[bytes], int]:
    handle = spawn_journaled(sandbox, "prompt-run", command, prompt=prompt)
    reader = JournalReader(sandbox, handle.paths, nonce=handle.nonce)
    lines = [line for line, _ in reader]
    assert reader.exit_code is not None
    return lines, reader.exit_code


def _python(code: str, *args: str, stdin: bool = False) -> AgentCommand:
    return AgentCommand(("python3", "-c", code, *args), stdin_prompt=stdin)


def _digest(data: bytes) -> list[bytes]:
    return [f"{len(data)} {hashlib.sha256(data).hexdigest()}".encode()]


def test_a_mebibyte_prompt_through_a_file_and_through_stdin(sandbox: Sandbox) -> None:
    prompt = (b"-first line\n" + bytes(range(1, 256)) * 4200)[: MIB - 2] + b"\n\n"
    assert len(prompt) == MIB
    assert _read(sandbox, _python(FROM_FILE, PROMPT_FILE), prompt) == (_digest(prompt), 0)
    assert _read(sandbox, _python(FROM_STDIN, stdin=True), prompt) == (_digest(prompt), 0)
    # Without prompt_stdin, standard input is empty.
    assert _read(sandbox, _python(FROM_STDIN), prompt) == (_digest(b""), 0)


def test_an_argument_prompt_is_exact_up_to_the_kernel_limit_and_refused_beyond(
    sandbox: Sandbox,
) -> None:
    prompt = ("-" + "ü" * (MAX_ARGUMENT_BYTES // 2 - 2) + "\n\n").encode()
    assert len(prompt) <= MAX_ARGUMENT_BYTES
    assert _read(sandbox, _python(FROM_ARGUMENT, PROMPT), prompt) == (_digest(prompt), 0)
    with pytest.raises(SandboxError) as caught:
        spawn_journaled(sandbox, "prompt-run", _python(FROM_ARGUMENT, PROMPT), prompt=b"x" * MIB)
    assert caught.value.reason == "prompt-too-long"
    assert "{prompt_file}" in caught.value.message


def test_an_env_value_is_exact_up_to_the_kernel_limit_and_refused_beyond(
    sandbox: Sandbox,
) -> None:
    """One ``NAME=value`` is one string of the agent's exec: the kernel's limit for one
    argument holds for it too, and past it the run is refused before anything starts,
    not failed by the agent's shell (``Argument list too long``, exit 126)."""
    value = "v" * (MAX_ARGUMENT_BYTES - len("BIG="))
    echo = AgentCommand(("python3", "-c", ECHO_ENV), env={"BIG": value})
    assert _read(sandbox, echo, b"") == (_digest(value.encode()), 0)
    too_long = AgentCommand(("python3", "-c", ECHO_ENV), env={"BIG": value + "v"})
    with pytest.raises(SandboxError) as caught:
        spawn_journaled(sandbox, "env-run", too_long)
    assert (caught.value.reason, caught.value.run_id) == ("env-too-long", "env-run")
    assert list_journals(sandbox, "env-run") == []


@pytest.fixture
def fake_clis(provider: SandboxProvider, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``claude`` and ``codex`` stand-ins in a directory every provider can see."""
    if provider.name == "ssh":
        pytest.skip("the stand-ins are bound into jails; ssh runs the same shell code")
    bin_dir = tmp_path_factory.mktemp("fake-clis")
    for name, text in (("claude", FAKE_CLAUDE), ("codex", FAKE_CODEX)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    bin_dir.chmod(0o755)
    return bin_dir


def test_the_presets_never_take_the_prompt_for_an_option(
    provider: SandboxProvider, fake_clis: Path
) -> None:
    """The claude-code and codex presets, with a prompt full of options and shell syntax."""
    ref = provider.create("prompt-run", SandboxSpec())
    sandbox = provider.resume(ref)
    assert sandbox is not None
    path = {"PATH": f"{fake_clis}:/usr/bin:/bin"}
    try:
        claude = AgentSpec.from_payload({"preset": "claude-code", "env": path})
        command = claude.start_command()
        command = AgentCommand(command.argv, command.env, command.stdin_prompt, (str(fake_clis),))
        lines, code = _read(sandbox, command, HOSTILE_PROMPT.encode())
        expected = repr(["claude", True, "stream-json", None, HOSTILE_PROMPT])
        assert (code, lines) == (0, [expected.encode()])
        codex = AgentSpec.from_payload({"preset": "codex", "env": path})
        resumed = codex.continuation_command(session_id="th-1")
        resumed = AgentCommand(resumed.argv, resumed.env, resumed.stdin_prompt, (str(fake_clis),))
        lines, code = _read(sandbox, resumed, HOSTILE_PROMPT.encode())
        expected = repr(["codex", "exec", True, ["resume", "th-1"], HOSTILE_PROMPT])
        assert (code, lines) == (0, [expected.encode()])
        assert not (Path(ref.workspace) / "pwned").exists()
    finally:
        provider.destroy(ref)


def test_only_the_agent_itself_holds_an_argument_prompt(sandbox: Sandbox) -> None:
    """``{prompt}`` is read inside the sandbox: the writer's shell, bwrap and every other
    process on this host never have it on their command line; ``{prompt_file}`` and stdin
    put it on none at all."""
    marker = f"prompt-marker-{secrets.token_hex(8)}"  # this test's alone: others run beside it
    wait = "touch ready; while [ ! -e go ]; do sleep 0.02; done; printf '%s\\n' \"$1\""
    workspace = Path(sandbox.ref.workspace)
    for args in ([PROMPT], [PROMPT_FILE]):
        for name in ("ready", "go"):
            (workspace / name).unlink(missing_ok=True)
        command = AgentCommand(("/bin/sh", "-c", wait, "sh", *args))
        handle = spawn_journaled(sandbox, "prompt-run", command, prompt=marker.encode())
        for _ in range(1500):  # hang guard while the agent starts
            if (workspace / "ready").exists():
                break
            time.sleep(0.02)
        found = {
            p.info["pid"]: (p.info["ppid"], p.info["cmdline"])
            for p in psutil.process_iter(["pid", "ppid", "cmdline"])
            if any(marker in part for part in p.info["cmdline"] or [])
        }
        # The shell's fork for ``sleep`` shares its command line until it execs: the
        # agent itself, not another holder.
        holders = [
            cmdline
            for ppid, cmdline in found.values()
            if ppid not in found or found[ppid][1] != cmdline
        ]
        (workspace / "go").touch()
        reader = JournalReader(sandbox, handle.paths, nonce=handle.nonce)
        printed = [line for line, _ in reader]
        assert reader.exit_code == 0
        if args == [PROMPT]:
            assert holders == [["/bin/sh", "-c", wait, "sh", marker]]
            assert printed == [marker.encode()]
        else:
            assert holders == []
            assert printed in ([b"/run/turnkeeper/prompt"], [handle.paths.prompt_file.encode()])
