"""Key names: one hash tag per run, injective, safe whatever the run id holds."""

from __future__ import annotations

import re

import pytest

from turnkeeper.errors import ConfigError
from turnkeeper.log.keys import RunKeys, check_namespace, run_tag

TAG = re.compile(r"\{([^}]*)\}")


@pytest.mark.parametrize(
    "run_id",
    ["run-1", "0190b5e2-7f3a-7cc1-9a5e-2f1d7e0c9b11", "a:b.c_d", "a}", "{x}", "é", "x" * 255, " "],
)
def test_both_keys_share_one_hash_tag_without_braces_inside(run_id: str) -> None:
    keys = RunKeys.of("ns", run_id)
    tags = [TAG.search(key) for key in keys.as_list()]
    assert all(tag is not None for tag in tags)
    assert {tag.group(1) for tag in tags if tag} == {run_tag(run_id)}
    assert keys.stream.startswith("ns:log:{")
    assert keys.meta == keys.stream + ":meta"


def test_plain_run_ids_are_their_own_tag_and_others_are_hashed() -> None:
    assert run_tag("run-1") == "run-1"
    assert re.fullmatch(r"~[0-9a-f]{64}", run_tag("a}"))
    assert re.fullmatch(r"~[0-9a-f]{64}", run_tag("x" * 129))
    assert run_tag("x" * 128) == "x" * 128


def test_tags_are_distinct_for_distinct_run_ids() -> None:
    run_ids = ["a", "a}", "{a}", "~a", "a ", "A", "x" * 128, "x" * 129, "é", "e"]
    assert len({run_tag(r) for r in run_ids}) == len(run_ids)


@pytest.mark.parametrize("namespace", ["", "a{b", "a}b", "a b", "x" * 129])
def test_namespaces_that_would_move_the_tag_are_refused(namespace: str) -> None:
    with pytest.raises(ConfigError):
        check_namespace(namespace)
