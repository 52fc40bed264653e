"""The local tier's view (``%ckpt_tiers``), from hand-made engine answers.

No cluster: each answer is what ``set_tiers`` on one engine returns. The real
cluster's table is in ``tests/test_magics.py``.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from nbckpt.protocol import Tier
from nbckpt.protocol import typescript as gen
from nbckpt.session.tiers import tier_fields
from nbckpt.views.tiers import tiers_text, tiers_view

OPTIONS = {"local_replicas": 1, "persistent_every": 2, "local_keep": 2}


def _answer(process: int, host: str | None, holdings: dict[int, tuple[int, list[int]]]) -> Any:
    return {
        "process": process,
        "host": host,
        "local_dir": None if host is None else f"/shm/{host}",
        "options": {"local_dir": None if host is None else f"/shm/{host}", **OPTIONS},
        "holdings": {str(s): {"processes": n, "held": held} for s, (n, held) in holdings.items()},
    }


# Three processes on two hosts; step 6 lost process 2's shards (its host "b" was
# replaced, and "a" kept no copy of them), step 4 is whole.
ANSWERS = [
    _answer(1, "b", {4: (3, [1, 2])}),
    _answer(0, "a", {4: (3, [0, 1]), 6: (3, [0, 1])}),
    _answer(2, "b", {4: (3, [1, 2])}),  # the same host again: counted once
]


def test_a_whole_step_is_recoverable_and_a_step_missing_a_process_is_not() -> None:
    view = tiers_view("/ck", ANSWERS, persistent=[2, 4])
    rows = {s["step"]: s for s in view["steps"]}
    assert [s["step"] for s in view["steps"]] == [6, 4]  # newest first
    assert rows[6]["holders"] == {"a": [0, 1]}
    assert rows[6]["missing"] == [2] and not rows[6]["recoverable"]
    assert rows[6]["persistent"] is False
    assert rows[4]["holders"] == {"a": [0, 1], "b": [1, 2]}
    assert rows[4]["missing"] == [] and rows[4]["recoverable"] and rows[4]["persistent"]
    assert [(h["host"], h["processes"]) for h in view["hosts"]] == [("a", [0]), ("b", [1, 2])]
    # The newest step held whole is as new as the root's: a restore reads it locally.
    assert view["restore"] == {"step": 4, "tier": Tier.LOCAL}
    assert view["persistent_steps"] == [4, 2]
    assert view["without"] == [] and view["disagreeing"] == []


def test_the_text_names_hosts_holders_and_what_is_missing() -> None:
    text = tiers_text(tiers_view("/ck", ANSWERS, persistent=[2, 4]))
    assert "local tier on 2 host(s), 1 replica of each" in text
    assert "the steps divisible by 2 also to the root, the newest 2 kept locally" in text
    assert re.search(r"^\s+6  no\s+no\s+a: 0,1  \(missing 2\)$", text, re.M), text
    assert re.search(r"^\s+4  yes\s+yes\s+a: 0,1  b: 1,2$", text, re.M), text
    assert "host b: process 1,2, /shm/b" in text
    assert "in the root: 4, 2" in text
    assert text.endswith("would read step 4 from the hosts' local copies")


def test_a_newer_root_step_wins_and_is_shown_without_a_local_copy() -> None:
    view = tiers_view("/ck", ANSWERS, persistent=[8])
    assert [s["step"] for s in view["steps"]] == [8, 6, 4]
    assert view["steps"][0]["holders"] == {} and view["steps"][0]["persistent"]
    assert view["restore"] == {"step": 8, "tier": Tier.PERSISTENT}
    assert "would read step 8 from the root" in tiers_text(view)


def test_a_root_the_notebook_cannot_list_is_unknown_not_absent() -> None:
    view = tiers_view("s3://b/ck", ANSWERS, persistent=None)
    assert all(s["persistent"] is None for s in view["steps"])
    text = tiers_text(view)
    assert re.search(r"^\s+4  yes\s+\?\s+", text, re.M), text
    assert "unless the root holds a newer one" in text


def test_no_tier_anywhere_and_processes_that_differ_are_said() -> None:
    off = tiers_view("/ck", [_answer(0, None, {}), _answer(1, None, {})], persistent=[])
    assert off["hosts"] == [] and off["without"] == [0, 1] and off["steps"] == []
    assert tiers_text(off).startswith("/ck: no local tier")
    odd = _answer(1, "b", {})
    odd["options"]["local_keep"] = 5
    view = tiers_view("/ck", [_answer(0, "a", {}), odd, _answer(2, None, {})], persistent=[])
    assert view["disagreeing"] == [1] and view["without"] == [2]
    text = tiers_text(view)
    assert "no local tier on process 2" in text and "differ from process 0's on 1" in text


def test_every_key_of_the_view_is_typed() -> None:
    text = gen.render()
    view = tiers_view("/ck", ANSWERS, persistent=[2, 4])
    for name, keys in [
        ("ITiersView", view),
        ("ITierStep", view["steps"][0]),
        ("ITierHost", view["hosts"][0]),
        ("ITierSettings", view["settings"]),
        ("ITierChoice", view["restore"]),
    ]:
        body = re.search(rf"^export interface {name} \{{\n(.*?)^\}}", text, re.M | re.S)
        assert body is not None, name
        for key in keys:
            assert re.search(rf"^  {key}: ", body.group(1), re.M), (name, key)


# -- the client's checks, before anything is sent -------------------------------------


def test_the_clients_tier_options_become_the_engines_fields() -> None:
    assert tier_fields(None, None, None, None, off=False) is None  # report only
    assert tier_fields(None, None, None, None, off=True) == {"local_dir": None}
    assert tier_fields("/shm/h{process}", 0, None, 3, off=False) == {
        "local_dir": "/shm/h{process}",
        "local_replicas": 0,
        "persistent_every": 1,
        "local_keep": 3,
    }


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ((None, 2, None, None, False), "replicas need a local directory"),
        (("/x", None, None, None, True), "off turns the local tier off"),
        (("relative", None, None, None, False), "must be absolute"),
        ((" ", None, None, None, False), "is empty"),
        (("/x", -1, None, None, False), "replicas must be a whole number of at least 0"),
        (("/x", None, 0, None, False), "persistent_every must be a whole number of at least 1"),
        (("/x", None, None, True, False), "keep must be a whole number of at least 1"),
    ],
)
def test_bad_tier_options_are_refused_before_anything_is_sent(args: Any, words: str) -> None:
    local, replicas, every, keep, off = args
    with pytest.raises(ValueError, match=re.escape(words)):
        tier_fields(local, replicas, every, keep, off)
