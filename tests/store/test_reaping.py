"""Contract tests: the reaper's primitives (runs_to_reap, forget_sandbox,
unsettled_sandbox_refs), including every refusal path."""

from __future__ import annotations

import time

import pytest

from tests.store.conftest import admit, claimed
from turnkeeper.errors import InvalidInputError
from turnkeeper.store import Claim, Store, Verdict


def _ref(name: str) -> dict[str, object]:
    """A placement record: the sandbox, and the journals that ran in it."""
    return {
        "sandbox": {"provider": "local", "path": f"/sandboxes/{name}"},
        "journals": [{"process": 1, "run_id": name}],
    }


def test_runs_to_reap_lists_settled_runs_with_a_sandbox_oldest_settled_first(
    store: Store,
) -> None:
    claims = {name: claimed(store, name, f"s-{name}") for name in ("a", "b", "c", "d", "e")}
    for name, claim in claims.items():
        if name != "e":  # e keeps no sandbox reference
            assert store.record_sandbox(claim, _ref(name)) is Verdict.DONE
    admit(store, "q", "s-q")  # queued: never reaped
    # Settle out of name order, a moment apart, so finished_at orders them b, d, a.
    for name, status in (("b", "completed"), ("d", "failed"), ("a", "aborted")):
        assert store.settle_run(claims[name], status) is Verdict.DONE
        time.sleep(0.01)
    assert store.settle_run(claims["e"], "completed") is Verdict.DONE
    # c is still running: its sandbox must be kept.
    assert [(r.run_id, r.sandbox_ref) for r in store.runs_to_reap(10)] == [
        ("b", _ref("b")),
        ("d", _ref("d")),
        ("a", _ref("a")),
    ]
    assert [r.run_id for r in store.runs_to_reap(2)] == ["b", "d"]


def test_forget_sandbox_drops_the_reference_of_settled_runs_only(store: Store) -> None:
    settled = claimed(store, "done", "s1")
    running = claimed(store, "busy", "s2")
    assert store.record_sandbox(settled, _ref("done")) is Verdict.DONE
    assert store.record_sandbox(running, _ref("busy")) is Verdict.DONE
    assert store.settle_run(settled, "completed") is Verdict.DONE
    assert not store.forget_sandbox("busy")  # running: refused, reference kept
    assert not store.forget_sandbox("unknown")
    assert store.get_run("busy").sandbox_ref == _ref("busy")  # type: ignore[union-attr]
    assert store.forget_sandbox("done")
    # The sandbox is forgotten; the journals stay, for a rebuild of the run's log.
    kept = {"journals": _ref("done")["journals"]}
    assert store.get_run("done").sandbox_ref == kept  # type: ignore[union-attr]
    assert store.runs_to_reap(10) == []
    # Forgetting twice changes nothing more and still says the run is settled.
    assert store.forget_sandbox("done")
    assert store.get_run("done").status == "completed"  # type: ignore[union-attr]


def test_unsettled_sandbox_refs_are_what_the_reaper_must_keep(store: Store) -> None:
    assert store.unsettled_sandbox_refs() == []
    first = claimed(store, "r1", "s1")
    second = claimed(store, "r2", "s2")
    claimed(store, "r3", "s3")  # running without a sandbox reference
    admit(store, "q", "s4")  # queued without one
    assert store.record_sandbox(first, _ref("r1")) is Verdict.DONE
    assert store.record_sandbox(second, _ref("r2")) is Verdict.DONE
    assert sorted(store.unsettled_sandbox_refs(), key=str) == [_ref("r1"), _ref("r2")]
    assert store.settle_run(first, "completed") is Verdict.DONE
    assert store.unsettled_sandbox_refs() == [_ref("r2")]
    # A stale attempt cannot move the reference the reaper relies on.
    assert store.record_sandbox(Claim("r2", "stale", 1), _ref("elsewhere")) is Verdict.NOT_OWNER
    assert store.unsettled_sandbox_refs() == [_ref("r2")]


def _moved(sandboxes: list[str]) -> dict[str, object]:
    """A placement whose agent processes ran in ``sandboxes`` in turn, the last its own."""
    return {
        "sandbox": {"provider": "local", "id": sandboxes[-1]},
        "journals": [
            {"ref": {"provider": "local", "id": sid}, "process": 1, "run_id": "r"}
            for sid in sandboxes
        ],
        "host": "host-b",
    }


def test_superseded_sandboxes_are_those_a_run_moved_on_from(store: Store) -> None:
    """A run continued on another host names its first sandbox in its first journal
    only: that one is superseded, the run's own never is, nor are runs settled long ago."""
    moved = claimed(store, "moved", "s1")
    stayed = claimed(store, "stayed", "s2")
    settled = claimed(store, "settled", "s3")
    old = claimed(store, "old", "s4")
    assert store.record_sandbox(moved, _moved(["a1", "b1"])) is Verdict.DONE
    assert store.record_sandbox(stayed, _moved(["a2", "a2"])) is Verdict.DONE
    assert store.record_sandbox(settled, _moved(["a3", "b3"])) is Verdict.DONE
    assert store.record_sandbox(old, _moved(["a4", "b4"])) is Verdict.DONE
    assert store.settle_run(settled, "completed") is Verdict.DONE
    assert store.forget_sandbox("settled")  # reaped: its journals stay
    assert store.settle_run(old, "completed") is Verdict.DONE
    assert store.superseded_sandboxes(3600) == {"a1", "a3", "a4"}
    time.sleep(0.2)
    assert store.superseded_sandboxes(0.1) == {"a1"}
    with pytest.raises(InvalidInputError):
        store.superseded_sandboxes(-1)


@pytest.mark.parametrize("limit", [0, -1, True, 1.5, "3"])
def test_runs_to_reap_refuses_bad_limits_before_any_sql(store: Store, limit: object) -> None:
    with pytest.raises(InvalidInputError):
        store.runs_to_reap(limit)  # type: ignore[arg-type]


@pytest.mark.parametrize("run_id", ["", "x" * 256, "a\x00b", 7, None])
def test_forget_sandbox_refuses_bad_run_ids(store: Store, run_id: object) -> None:
    with pytest.raises(InvalidInputError):
        store.forget_sandbox(run_id)  # type: ignore[arg-type]
