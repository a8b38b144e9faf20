"""Worker processes: their runtime (connections opened after fork) and lease heartbeats."""

from turnkeeper.workers.lease import LeaseKeeper
from turnkeeper.workers.runtime import WorkerRuntime, runtime_for

__all__ = ["LeaseKeeper", "WorkerRuntime", "runtime_for"]
