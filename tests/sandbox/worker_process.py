"""A stand-in worker: resumes a sandbox, starts an agent journaled, then idles until killed."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from turnkeeper.sandbox import SandboxRef, spawn_journaled
from turnkeeper.sandbox.bwrap import BwrapProvider
from turnkeeper.sandbox.local import LocalProvider
from turnkeeper.sandbox.provider import SandboxProvider
from turnkeeper.sandbox.ssh import SshProvider, SshTarget
from turnkeeper.sandbox.uids import UidPool


def main() -> None:
    config = json.loads(sys.argv[1])
    ref = SandboxRef.from_dict(config["ref"])
    provider: SandboxProvider
    if ref.provider == "ssh":
        ssh = config["ssh"]
        provider = SshProvider(
            SshTarget(
                host=ssh["host"], port=ssh["port"], user=ssh["user"], root=ssh["root"],
                identity_file=Path(ssh["identity_file"]), known_hosts_file=Path("/dev/null"),
                strict_host_key_checking=False, control_dir=Path(ssh["control_dir"]),
            )
        )  # fmt: skip
    elif ref.provider == "bwrap":
        provider = BwrapProvider(Path(config["root"]), uids=UidPool(*config["uids"]))
    else:
        provider = LocalProvider(Path(config["root"]))
    sandbox = provider.resume(ref)
    if sandbox is None:
        raise SystemExit("sandbox is gone")
    handle = spawn_journaled(sandbox, "run-1", config["command"])
    sys.stdout.write(f"spawned {handle.nonce}\n")
    sys.stdout.flush()
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main()
