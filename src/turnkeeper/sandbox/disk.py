"""A sandbox's disk limit: a watcher beside the agent, run by the journal writer.

Every provider's writer is a shell on the sandbox's host (root's for a root ``bwrap``
worker, the ssh user's on an ``ssh`` host), so the limit is enforced there, by shell
code, the same way everywhere: no project quota, loop image or tmpfs a non-root ssh
user could not make (docs/architecture.md, "Limits"). Twice a second the watcher
measures what the agent holds on disk:

- the blocks of its workspace (``du``, one file system, hard links once), run as
  root, or where the writer is not root inside a user namespace that maps the
  writer's uid to root, so that a directory the agent made unreadable (``chmod 0``)
  still counts;
- the blocks of files deleted from the workspace's file system that the agent's
  processes still hold open (``/proc/<pid>/fd``) or mapped: ``du`` no longer sees them,
  the disk still holds them. Mappings are read as text, one ``/proc/<pid>/maps`` per
  process (device, inode, ``(deleted)``), and one ``/proc/<pid>/map_files`` entry
  followed (which only root may do) per deleted file, not one per mapping: an agent
  may map one page sixty thousand times in each of its processes;
- the number of files of the workspace, against one file per ``BYTES_PER_FILE`` of the
  limit, the ratio at which ``mkfs.ext4`` gives a file system inodes: empty files hold
  no blocks, yet enough of them exhaust the host's inodes.

The agent's processes are its cgroup's members where it has one (a root worker's
sandbox): one file read a round, whatever else runs on the host. Without one the
watcher reads the agent's process tree from the parent of every process on the host.

Past either limit it writes its verdict (``<journal>.limit``, beside the journal, out
of the agent's reach) and SIGKILLs the agent, and nothing else: the pids it read at
the start of the round may belong to other processes by then. A launch says how
(``AgentLaunch.stop``): a jail's ``bwrap`` alone, whose pid namespace ends with it and
whose pid is the writer's unreaped child, so never another's; a cgroup's members;
otherwise the agent's process tree read again right before the kill. The writer then
drains the agent's output into the journal and appends the sentinel as after any exit,
so no byte the agent already wrote is lost, and the driver reads the verdict
(``disk-limit``).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from turnkeeper.sandbox.command import ENV_FD
from turnkeeper.sandbox.journal import LAUNCH_FAILED_EXIT, JournalPaths

MIN_PAUSE = 50
"""Centiseconds between two measurements at least: a fast writer may overshoot by what
it writes in this time and one measurement."""
PAUSE_FACTOR = 4
"""A pause is at least this many times the measurement before it: measuring a huge
workspace (a walk of every file) costs at most a fifth of a core."""
MAX_PAUSE = 300
"""Centiseconds between two measurements at most: an agent that makes measuring slow
(a hundred thousand mappings, say) must not stretch the pause after it as well, which
would let it write for four times as long unwatched."""
BYTES_PER_FILE = 16 * 1024
"""The workspace may hold one file per this many bytes of its limit (``mkfs.ext4``'s
default inode ratio)."""
VERDICT = "disk-limit"
_VERDICT = re.compile(rb"disk-limit ([0-9]+) ([0-9]+) ([0-9]+) ([0-9]+)\n")


def file_limit(disk_bytes: int) -> int:
    """How many files (inodes) a workspace of ``disk_bytes`` may hold."""
    return max(1, disk_bytes // BYTES_PER_FILE)


@dataclass(frozen=True, slots=True)
class DiskVerdict:
    """What the watcher measured when it stopped the agent."""

    used_bytes: int
    limit_bytes: int
    files: int
    file_limit: int

    @property
    def too_many_files(self) -> bool:
        return self.used_bytes <= self.limit_bytes and self.files > self.file_limit

    @property
    def message(self) -> str:
        if self.too_many_files:
            return "the agent made more files in its workspace than its disk limit allows"
        return "the agent filled its workspace past its disk limit and was stopped"

    def as_limits(self) -> dict[str, int]:
        """The run error's ``limits`` entries."""
        return {
            "disk_bytes": self.used_bytes,
            "disk_limit_bytes": self.limit_bytes,
            "disk_files": self.files,
            "disk_file_limit": self.file_limit,
        }


def parse_verdict(data: bytes) -> DiskVerdict | None:
    """The verdict file's content, or None when there is none (the watcher never acted)."""
    match = _VERDICT.fullmatch(data)
    if match is None:
        return None
    used, limit, files, max_files = (int(group) for group in match.groups())
    return DiskVerdict(used, limit, files, max_files)


# The watcher, run by the writer beside the agent ($agent: the pid of its launch, the
# jail's bwrap). Each round: the agent's processes, its cgroup's members where the launch
# names their file ($members), else its process tree, it first, from every PPid (grep skips a
# process that vanished, which would end mawk reading its files); then one awk
# over the deleted files of the workspace's file system that tree holds (nlink 0: its
# descriptors, and one map_files entry for each deleted device and inode its maps
# name) and every file of the workspace, each inode once (hard links, a file open
# twice); then the verdict, or a pause of PAUSE_FACTOR times what the round took, within
# MIN_PAUSE and MAX_PAUSE (from /proc/uptime, in centiseconds: no process to fork);
# past a limit, the launch's $stop, or the tree read again. Shell arithmetic is 64-bit.
WATCHER = r"""
dev=$(stat -c %d -- "$ws") || exit 0
as_owner=
if [ "$(id -u)" -ne 0 ] && unshare -r true 2>/dev/null; then as_owner="unshare -r"; fi
agent_tree() {
  grep -sH '^PPid:' /proc/[0-9]*/status | awk -F '[/:\t ]+' -v root="$agent" '
    { kids[$6] = kids[$6] " " $3 }
    END { n = 1; queue[1] = root
      for (i = 1; i <= n; i++) { printf "%s ", queue[i]
        m = split(kids[queue[i]], more, " "); for (j = 1; j <= m; j++) queue[++n] = more[j] } }'
}
while kill -0 "$agent" 2>/dev/null; do
  read -r began _ < /proc/uptime
  if [ -n "$members" ]; then  # read by the shell itself: no process to fork
    tree=; { while read -r pid; do tree="$tree $pid"; done < "$members"; } 2>/dev/null
  else tree=$(agent_tree); fi
  set --; maps=
  for pid in $tree; do set -- "$@" "/proc/$pid/fd"; maps="$maps /proc/$pid/maps"; done
  measured=$({
    [ $# -eq 0 ] || find -L "$@" -mindepth 1 -maxdepth 1 -printf 'held %D %i %n %b\n'
    [ -z "$maps" ] || grep -sH ' (deleted)$' $maps | awk '
      $5 != 0 && !seen[$4 " " $5]++ {
        split($1, at, ":"); sub(/maps$/, "map_files/", at[1]); print at[1] at[2] }' |
      xargs -r sh -c 'exec find -L "$@" -maxdepth 0 -printf "held %D %i %n %b\n"' sh
    $as_owner find "$ws" -xdev -printf 'file %D %i %n %b\n'
  } 2>/dev/null | awk -v dev="$dev" '
    $1 == "held" && ($2 != dev || $4 != 0) { next }
    !seen[$3]++ { blocks += $5; if ($1 == "file") files++ }
    END { printf "%.0f %d", blocks * 512, files }')
  used=${measured% *} files=${measured#* }
  if [ "${used:-0}" -gt "$limit" ] || [ "${files:-0}" -gt "$max_files" ]; then
    printf '%s %s %s %s %s\n' "$verdict_name" "$used" "$limit" "$files" "$max_files" \
      > "$verdict"
    if [ -n "$stop" ]; then eval "$stop"; else kill -KILL $(agent_tree) 2>/dev/null; fi
    exit 0
  fi
  read -r ended _ < /proc/uptime
  pause=$(( (${ended%.*}${ended#*.} - ${began%.*}${began#*.}) * pause_factor ))
  [ "$pause" -ge "$min_pause" ] || pause=$min_pause
  [ "$pause" -le "$max_pause" ] || pause=$max_pause
  sleep "$((pause / 100)).$((pause % 100 / 10))$((pause % 10))"
done
"""


def watched_launch(
    launch: str,
    workspace: str,
    paths: JournalPaths,
    limit_bytes: int,
    *,
    stop: str = "",
    members: str = "",
) -> str:
    """``launch`` (the writer's shell code that runs the agent) with the disk watcher
    beside it: same exit status (137 when the watcher killed the agent), and the
    watcher ends with the agent. The watcher holds none of the writer's descriptors (its
    output pipes, the agent's environment), so it never delays the journal's end. Each
    file the agent writes is capped at the limit too (``RLIMIT_FSIZE``). ``stop`` is the
    launch's way to kill every process of the agent and none other (``AgentLaunch.stop``);
    without one the watcher kills the process tree it reads right then. ``members`` lists
    the pids of the agent's processes (``AgentLaunch.members``); without it the watcher
    reads the agent's process tree from every process's parent, each round."""
    settings = " ".join(
        f"{name}={shlex.quote(str(value))}"
        for name, value in (
            ("ws", workspace),
            ("verdict", paths.limit_file),
            ("verdict_name", VERDICT),
            ("limit", limit_bytes),
            ("max_files", file_limit(limit_bytes)),
            ("min_pause", MIN_PAUSE),
            ("pause_factor", PAUSE_FACTOR),
            ("max_pause", MAX_PAUSE),
            ("stop", stop),
            ("members", members),
        )
    )
    # No one file of the agent's may pass the limit (SIGXFSZ, or EFBIG where it is
    # ignored): a single fast writer then stops at the limit, whatever the interval.
    file_cap = -(-limit_bytes // 512)
    return (
        f"( ulimit -f {file_cap} || exit {LAUNCH_FAILED_EXIT}; {launch} & agent=$!; "
        f"( exec </dev/null >/dev/null 2>&1 {ENV_FD}<&-; {settings}\n{WATCHER} ) & watcher=$!; "
        'wait "$agent" 2>/dev/null; status=$?; kill "$watcher" 2>/dev/null; exit "$status" )'
    )
