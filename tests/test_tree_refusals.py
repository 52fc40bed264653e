"""A tree that cannot be saved is refused by ``save()`` itself, before anything is written."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from urllib.parse import unquote

import jax
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nbckpt.engine import AsyncCheckpointer
from nbckpt.engine.arrays.tree import (
    EMPTY,
    NAME_MAX,
    RESERVED_NAMES,
    flatten,
    leaf_name,
    legacy_leaf_name,
)
from nbckpt.formats.layout import METADATA_FILE


def _listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize(
    ("tree", "error", "match"),
    [
        # unsupported leaves, dtypes and keys: TypeError naming the leaf
        ({"opt": {"name": "adam"}}, TypeError, r"leaf \['opt'\]\['name'\] is a str"),
        ({"t": np.zeros(2, "datetime64[s]")}, TypeError, r"\['t'\] has dtype datetime64"),
        ({"a": {1.5: 1}}, TypeError, r"leaf \['a'\]\[1\.5\]: dict key 1\.5 is not a str or int"),
        ({"a": [{None: 1}]}, TypeError, r"leaf \['a'\]\[0\]\[None\]"),
        ({"f": lambda x: x}, TypeError, r"leaf \['f'\] is a function"),
        # keys that collide once they are names on disk: ValueError naming both leaves
        ({"W": 1, "w": 2}, ValueError, r"leaves \['W'\] and \['w'\] .* differ only in case"),
        ({"Ab": {"c": 1}, "aB": {"C": 2}}, ValueError, r"\['Ab'\]\['c'\] and \['aB'\]\['C'\]"),
        ({1: 1, "1": 2}, ValueError, "does a dict mix key types"),
        # names the step directory uses itself
        ({"_CHECKPOINT_METADATA": 1}, ValueError, "the step directory uses for its own"),
        ({"_checksums": np.ones(2)}, ValueError, r"stored as '_checksums'"),
        ({"commit_success": {"txt": 1}}, ValueError, r"\['commit_success'\]\['txt'\]"),
        # names too long for a file name
        ({"k" * 256: 1}, ValueError, "256 bytes .* over the 255-byte limit"),
        ({"é" * 43: 1}, ValueError, "258 bytes"),  # 43 x '%C3%A9'
        ({"a" * 100: {"b" * 100: {"c" * 60: 1}}}, ValueError, "262 bytes"),
    ],
)
def test_refusals_name_the_leaf(tree, error, match):
    with pytest.raises(error, match=match) as err:
        flatten(tree)
    assert "\n" not in str(err.value)


def test_save_refuses_before_writing_anything(tmp_path):
    ck = AsyncCheckpointer(tmp_path)
    before = _listing(tmp_path)
    for tree in ({"a": 1, "A": 2}, {"x": "text"}, {"k" * 300: 1}):
        with pytest.raises((TypeError, ValueError)):
            ck.save(1, tree)
    assert _listing(tmp_path) == before
    ck.save(1, {"a": 1})  # the checkpointer is still usable
    ck.wait_until_finished()
    assert ck.restore(1) == {"a": 1}


def test_awkward_keys_are_encoded_not_refused(tmp_path):
    """Empty, '.', '..', '/' and NUL keys are percent-encoded into safe, distinct names."""
    keys = ["", ".", "..", "a/b", "nul\x00", "a.b"]
    tree = {k: np.full(2, i) for i, k in enumerate(keys)} | {"a": {"b": np.full(2, 9)}}
    names = sorted(leaf.name for leaf in flatten(tree))
    assert names == ["%", "%2E", "%2E%2E", "a%2Eb", "a%2Fb", "a.b", "nul%00"]
    ck = AsyncCheckpointer(tmp_path, pack_bytes=0)  # each leaf a folder named by its name
    ck.save(1, tree)
    ck.wait_until_finished()
    assert set(names) <= set(os.listdir(tmp_path / "1"))
    out = ck.restore(1)
    assert jax.tree.structure(out) == jax.tree.structure(tree)
    assert all(jax.tree.leaves(jax.tree.map(np.array_equal, out, tree)))


def test_non_ascii_keys_get_utf8_names_that_stay_distinct():
    # Encoding code points (the old way) gave both of these '%4E2D'.
    names = {leaf.name for leaf in flatten({"中": 1, "\u04e2D": 2})}
    assert names == {"%E4%B8%AD", "%D3%A2D"}
    assert legacy_leaf_name((("key", "中"),)) == legacy_leaf_name((("key", "\u04e2D"),))


def test_a_step_saved_with_legacy_names_still_restores_into_a_target(tmp_path):
    """Steps saved before UTF-8 names hold code-point names; a target still finds them."""
    ck = AsyncCheckpointer(tmp_path, pack_bytes=0)  # such steps had no packs
    ck.save(1, {"é": np.arange(3.0), "n": 1})
    ck.wait_until_finished()
    step = tmp_path / "1"
    new, old = leaf_name((("key", "é"),)), legacy_leaf_name((("key", "é"),))
    assert (new, old) == ("%C3%A9", "%E9")
    shutil.move(step / new, step / old)
    meta = json.loads((step / METADATA_FILE).read_text())
    for leaf in meta["leaves"]:
        if leaf["name"] == new:
            leaf["name"] = old
    (step / METADATA_FILE).write_text(json.dumps(meta))
    sums = next((step / "_CHECKSUMS").glob("*.json"))
    sums.write_text(sums.read_text().replace(f'"{new}"', f'"{old}"'))
    out = ck.restore(1, target={"é": ..., "n": ...})
    assert np.array_equal(out["é"], np.arange(3.0))
    assert np.array_equal(ck.restore(1)["é"], np.arange(3.0))


# -- property: any nested dict of string keys either flattens safely or is refused ------

_keys = st.text(st.characters(exclude_categories=()), max_size=12) | st.sampled_from(
    ["", ".", "..", "/", "a/b", "\x00", "A", "a", "_CHECKSUMS", "%", "%25", "a.b"]
)
_leaves = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False),
    st.booleans(),
    st.just(np.zeros(2, np.float32)),
    st.just("text"),  # unsupported: TypeError
    st.just(np.array(["s"])),  # unsupported dtype: TypeError
)
_trees = st.recursive(
    _leaves,
    lambda children: st.dictionaries(_keys, children, max_size=4),
    max_leaves=12,
)


def _keys_of(leaf) -> list[str]:
    return [str(k) for _, k in leaf.path]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(_keys, _trees, max_size=4) | st.lists(_trees, max_size=3))
def test_flatten_gives_safe_unique_names_or_refuses(tree):
    try:
        # Empty nodes are recorded in the metadata, never stored under their names.
        leaves = [leaf for leaf in flatten(tree) if leaf.kind != EMPTY]
    except (TypeError, ValueError):
        return
    folded = [leaf.name.lower() for leaf in leaves]
    assert len(set(folded)) == len(folded)
    for leaf in leaves:
        name = leaf.name
        assert name and name not in (".", "..") and name.isascii()
        assert "/" not in name and "\\" not in name and "\x00" not in name
        assert len(name.encode()) <= NAME_MAX
        assert name.lower() not in RESERVED_NAMES
        if leaf.path:
            # The name decodes back to the keys: distinct key paths never share a name.
            parts = name.split(".")
            keys = ["" if p == "%" else unquote(p, errors="surrogatepass") for p in parts]
            assert keys == _keys_of(leaf)


def test_names_are_worked_out_once_per_structure_and_still_refuse(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A structure seen before reuses its names; its refusals and empty nodes still count."""
    from nbckpt.engine.arrays import tree as tree_mod

    first = tree_mod.flatten({"opt": {"mu": np.zeros(2), "nu": np.ones(2)}, "step": 3})
    calls = []
    made = jax.tree_util.tree_flatten_with_path
    monkeypatch.setattr(
        jax.tree_util, "tree_flatten_with_path", lambda *a, **k: calls.append(1) or made(*a, **k)
    )
    again = tree_mod.flatten({"opt": {"mu": np.ones(2), "nu": np.zeros(2)}, "step": 4})
    assert [leaf.name for leaf in again] == [leaf.name for leaf in first] and not calls
    assert again[0].value[0] == 1.0  # this call's values, not the first one's
    clash = {"W": np.zeros(1), "w": np.zeros(1)}
    for _ in range(2):  # the second time from what the first worked out
        with pytest.raises(ValueError, match="differ only in case"):
            tree_mod.flatten(clash)
    # The same structure with an empty node where a clashing leaf was stores nothing
    # under that name: nothing to refuse.
    leaves = tree_mod.flatten({"W": None, "w": np.zeros(1)})
    assert [leaf.kind for leaf in leaves] == [tree_mod.EMPTY, "numpy"]
