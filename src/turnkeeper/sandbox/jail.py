"""The bubblewrap jail of an agent: its argv, built by a pure function from a few paths.

What the agent sees: the system directories read-only (``/usr``, ``/bin``, ``/lib*``,
``/sbin``, ``/opt``; ``/usr/local`` is inside ``/usr``), the ``/etc`` entries that TLS,
DNS and user lookups need, the operator's extra read-only binds and the preset's own
(its interpreter, say), a synthesized ``passwd``/``group`` naming the agent's uid, its
workspace read-write at ``/workspace`` (its HOME and working directory), a private
``/tmp`` no larger than its memory limit, a ``/proc`` of its own pid namespace and a
minimal, read-only ``/dev``. The jail's own root (a tmpfs of bwrap's, holding ``/etc``
and ``/run``) is read-only too. Nothing else of the host: not the data directory, the
journals, other sandboxes, ``/run``, ``/root`` or ``/home`` (a worker refuses to start
when a bind would show one of the fleet's paths: ``exposure.py``). Every namespace is new,
network included: the only way out is the egress proxy's socket, bound in, when there
is one.

Run by root, bwrap builds the jail with root's rights (so it can bind any source) and
creates no user namespace; the agent then becomes the sandbox's own unprivileged uid
through ``setpriv`` before anything of it runs, with no capability left and
``no_new_privs`` set, under a seccomp filter that refuses it a user namespace of its
own (``seccomp.py``). Run by another user, bwrap makes a user namespace, drops every
capability and forbids nested user namespaces; the agent keeps that user's uid.

``jail_argv`` touches nothing (bind sources that may be missing use ``-try``), so the
ssh provider can build the same argv for its remote host.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from turnkeeper.sandbox.command import AgentCommand, AgentLaunch, agent_script
from turnkeeper.sandbox.journal import JournalPaths
from turnkeeper.sandbox.provider import base_environment

WORKSPACE = "/workspace"
PROMPT_PATH = "/run/turnkeeper/prompt"
"""Where the prompt is, inside the jail; only the agent's processes can read it."""
PROMPT_FD = 8
"""The writer hands bwrap the prompt file on this descriptor; bwrap copies it in."""
SECCOMP_FD = 7
"""The writer hands bwrap the seccomp filter (``seccomp.py``) on this descriptor."""
SECCOMP_FILE = "seccomp.bpf"
"""A root worker's filter, written in each sandbox's root (``BwrapSandbox.launch``)."""
STOP_JAIL = (
    'kill -STOP "$agent" 2>/dev/null; '
    "kill -KILL $(grep -s '^PPid:' /proc/[0-9]*/status | "
    """awk -F '[/:\\t ]+' -v agent="$agent" '$6 == agent { print $3 }') "$agent" 2>/dev/null"""
)
"""How the disk watcher kills a jailed agent (``AgentLaunch.stop``): its bwrap, and
bwrap's own child (the pid namespace's first process, whose death ends the namespace).
bwrap's child ties itself to bwrap's life (``--die-with-parent``) only once it has set
up the jail, so a bwrap killed before then would leave the jail running, orphaned, with
the journal's pipe open. Stopped first, bwrap reaps no child, so the pid of its child is
still its child's when the kill arrives."""
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt")
ETC_ENTRIES = (
    "ssl", "pki", "ca-certificates", "ca-certificates.conf", "crypto-policies",
    "resolv.conf", "hosts", "host.conf", "nsswitch.conf", "gai.conf", "services",
    "protocols", "localtime", "timezone", "alternatives", "ld.so.cache", "ld.so.conf",
    "ld.so.conf.d", "mime.types", "os-release",
)  # fmt: skip
HOSTNAME = "sandbox"


@dataclass(frozen=True, slots=True)
class Egress:
    """How the jail reaches the egress proxy (``turnkeeper.sandbox.egress``): bwrap
    arguments that bind its socket in, the command prefix that starts the in-jail
    forwarder and then runs the agent, and the variables that point clients at it."""

    bind: tuple[str, ...]
    launcher: tuple[str, ...]
    environment: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Jail:
    """Where an agent's jail comes from on its host."""

    workspace: str
    passwd_file: str
    group_file: str
    uid: int | None = None
    """The uid the agent becomes (a root worker); None keeps the caller's, in a user namespace."""
    gid: int | None = None
    """Its group with ``uid``: the jails' shared group, which alone may reach the proxy."""
    read_only: tuple[str, ...] = ()
    egress: Egress | None = None
    tmp_bytes: int | None = None
    """The size of the jail's ``/tmp``: its memory limit, which no rlimit counts there."""
    seccomp: bool = False
    """Load the filter on ``SECCOMP_FD``: no user namespaces where bwrap cannot forbid them."""


def jail_argv(jail: Jail, environment: Mapping[str, str], script: str) -> list[str]:
    """bwrap's argv running ``/bin/sh -c script`` as the agent.

    ``environment`` is the agent's base environment (no secrets: it is on this argv);
    the script loads the rest itself. The writer opens the prompt on ``PROMPT_FD``.
    """
    argv = ["bwrap"]
    if jail.uid is None:
        argv += ["--unshare-all", "--unshare-user", "--disable-userns"]
    else:  # root needs no user namespace, and one would leave the agent unable to switch uid
        argv += [
            "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try",
        ]  # fmt: skip
    argv += ["--die-with-parent", "--new-session", "--hostname", HOSTNAME]
    for path in SYSTEM_DIRS:
        argv += ["--ro-bind-try", path, path]
    # Directories bwrap makes on its own are 0700 root's: the agent could not enter them.
    argv += _directories(["/etc", "/run", "/run/turnkeeper"])
    for name in ETC_ENTRIES:
        argv += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
    argv += ["--ro-bind", jail.passwd_file, "/etc/passwd"]
    argv += ["--ro-bind", jail.group_file, "/etc/group"]
    tmp_size = [] if jail.tmp_bytes is None else ["--size", str(jail.tmp_bytes)]
    argv += [
        "--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev",
        "--perms", "1777", *tmp_size, "--tmpfs", "/tmp",  # noqa: S108 - the jail's own
        "--bind", jail.workspace, WORKSPACE,
        "--perms", "0444", "--ro-bind-data", str(PROMPT_FD), PROMPT_PATH,
    ]  # fmt: skip
    # Extra binds last, so that one below /tmp is not hidden by the jail's own /tmp.
    made = {"/", "/etc", "/run", "/run/turnkeeper", "/tmp"}  # noqa: S108 - as above
    for path in jail.read_only:
        if _under(path, SYSTEM_DIRS):
            continue  # already visible
        parents = [str(p) for p in reversed(PurePosixPath(path).parents) if str(p) not in made]
        argv += _directories(parents)
        made.update(parents)
        argv += ["--ro-bind", path, path]
    env = dict(environment)
    launcher: tuple[str, ...] = ()
    if jail.egress is not None:
        argv += jail.egress.bind
        env.update(jail.egress.environment)
        launcher = jail.egress.launcher
    # Last of the mounts: bwrap's own root tmpfs, with every directory made on it, is
    # read-only (a user namespace's agent owns them, and no limit counts what they hold).
    argv += ["--remount-ro", "/"]
    if jail.seccomp:
        argv += ["--seccomp", str(SECCOMP_FD)]
    argv.append("--clearenv")
    for key, value in env.items():
        argv += ["--setenv", key, value]
    if jail.uid is None:
        argv += ["--cap-drop", "ALL", "--"]
    else:
        # Only what setpriv needs to become the agent's uid, which clears them all.
        argv += [
            "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
            "--cap-add", "CAP_SETPCAP", "--",
            "setpriv", f"--reuid={jail.uid}", f"--regid={jail.gid or jail.uid}",
            "--clear-groups", "--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--",
        ]  # fmt: skip
    # The agent's uid enters its workspace (bwrap, holding no DAC capability, could not).
    script = f"cd {WORKSPACE} && unset OLDPWD || exit 125\n{script}"
    return [*argv, *launcher, "/bin/sh", "-c", script, "sh"]


def _directories(paths: Sequence[str]) -> list[str]:
    argv = []
    for path in paths:
        argv += ["--perms", "0755", "--dir", path]
    return argv


def _under(path: str, roots: Sequence[str]) -> bool:
    return any(path == root or path.startswith(root + "/") for root in roots)


def identity_files(uid: int, gid: int | None = None) -> tuple[str, str]:
    """``/etc/passwd`` and ``/etc/group`` for the jail: root, the agent, nobody.

    Programs look their own uid up (Node's ``os.userInfo``, Python's ``getpass``); the
    host's lists would fail for a sandbox uid and would show the host's accounts. The
    agent's group is ``gid`` (the jails' group), or ``uid`` when there is none.
    """
    gid = uid if gid is None else gid
    passwd = (
        "root:x:0:0:root:/root:/usr/sbin/nologin\n"
        f"agent:x:{uid}:{gid}:agent:{WORKSPACE}:/bin/bash\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    )
    group = f"root:x:0:\nagent:x:{gid}:\nnogroup:x:65534:\n"
    return passwd, group


def read_only_binds(paths: Sequence[str]) -> tuple[str, ...]:
    """The extra binds in a stable order without duplicates (what a preset adds repeats)."""
    return tuple(dict.fromkeys(paths))


PASSWD_FILE = "passwd"  # noqa: S105 - the jail's /etc/passwd, no password in it
GROUP_FILE = "group"
"""The jail's identity files, written in the sandbox's root (``identity_files``)."""


def jailed_launch(
    root: str,
    workspace: str,
    paths: JournalPaths,
    command: AgentCommand | str,
    *,
    ro_binds: Sequence[str],
    rlimits: tuple[int, int] | None,
    egress: Egress | None,
    uid: int | None = None,
    gid: int | None = None,
    tmp_bytes: int | None = None,
    seccomp: bool = False,
    prelude: str = "",
    members: str = "",
) -> AgentLaunch:
    """The shell code that starts ``command`` in a jail over ``workspace``: the
    sandbox's identity files from ``root``, the operator's read-only binds and the
    command's own, the prompt on ``PROMPT_FD`` (and with ``seccomp`` the filter in
    ``root`` on ``SECCOMP_FD``). ``prelude`` runs first, outside the jail (a cgroup
    attach); ``members`` lists the pids of the agent's processes (``AgentLaunch``)."""
    preset = command.read_only if isinstance(command, AgentCommand) else ()
    jail = Jail(
        workspace=workspace,
        passwd_file=f"{root}/{PASSWD_FILE}",
        group_file=f"{root}/{GROUP_FILE}",
        uid=uid,
        gid=gid,
        read_only=read_only_binds([*ro_binds, *preset]),
        egress=egress,
        tmp_bytes=tmp_bytes,
        seccomp=seccomp,
    )
    script = agent_script(command, PROMPT_PATH, rlimits)
    argv = shlex.join(jail_argv(jail, base_environment(WORKSPACE), script))
    files = f"{PROMPT_FD}<{shlex.quote(paths.prompt_file)}"
    if seccomp:
        files += f" {SECCOMP_FD}<{shlex.quote(f'{root}/{SECCOMP_FILE}')}"
    # bwrap itself is $agent (the subshell execs it), a child the writer has not reaped,
    # so its pid is no one else's; its death ends the jail's pid namespace
    # (--die-with-parent), which takes every process of the agent with it.
    return AgentLaunch(f"( {prelude}exec {argv} ) {files}", stop=STOP_JAIL, members=members)
