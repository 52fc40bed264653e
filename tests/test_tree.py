from typing import NamedTuple

import jax
import numpy as np
import pytest

from nbckpt.engine.arrays.tree import EMPTY, flatten, leaf_name, unflatten_paths


class Pair(NamedTuple):
    a: object
    b: object


def test_flatten_classifies_and_names_leaves():
    tree = {
        "params": {"w": jax.numpy.ones(2), "b/x": np.zeros(3)},
        "lr": 0.1,
        "hist": [np.float32(1.0), 3],
        "pair": Pair(1, 2),
    }
    leaves = {leaf.name: leaf.kind for leaf in flatten(tree)}
    assert leaves == {
        "hist.0": "numpy",
        "hist.1": "scalar",
        "lr": "scalar",
        "pair.a": "scalar",
        "pair.b": "scalar",
        "params.b%2Fx": "numpy",
        "params.w": "jax",
    }


def test_unsupported_leaf_names_its_path():
    with pytest.raises(TypeError, match=r"leaf \['opt'\]\[1\] is a str"):
        flatten({"opt": [1, "adam"]})
    with pytest.raises(TypeError, match="dtype <U3"):
        flatten({"names": np.array(["abc"])})


def test_names_stay_distinct_when_keys_contain_separators():
    names = [leaf.name for leaf in flatten({"a.b": 1, "a": {"b": 2}, "%2E": 3})]
    assert sorted(names) == ["%252E", "a%2Eb", "a.b"]


def test_root_leaf_and_unflatten():
    assert leaf_name(()) == "_root"
    tree = unflatten_paths(
        [
            ((("key", "a"), ("index", 1)), "y"),
            ((("key", "a"), ("index", 0)), "x"),
            ((("key", "b"),), 3),
        ]
    )
    assert tree == {"a": ["x", "y"], "b": 3}
    assert unflatten_paths([((), 5)]) == 5


def test_empty_nodes_are_leaves_of_their_own_kind_and_keys_are_key_data():
    tree = {"l": [1, None, ()], "n": Pair(None, {}), "k": jax.random.key(0)}
    leaves = {leaf.name: (leaf.kind, leaf.value) for leaf in flatten(tree) if leaf.kind == EMPTY}
    assert leaves == {
        "l.1": (EMPTY, "none"),
        "l.2": (EMPTY, "list"),
        "n.a": (EMPTY, "none"),
        "n.b": (EMPTY, "dict"),
    }
    [key] = [leaf for leaf in flatten(tree) if leaf.name == "k"]
    assert key.kind == "jax" and key.key_impl == "threefry2x32" and key.value.dtype == np.uint32


def test_unflatten_keeps_positions_of_unnamed_sequence_entries():
    tree = unflatten_paths([((("index", 2),), "c"), ((("index", 0),), "a")])
    assert tree == ["a", None, "c"]


def test_equal_keys_of_other_types_keep_their_own_names():
    # Names of keys are remembered between leaves; 1, True and "1" are equal or
    # alike as keys of a cache, and must not share a name.
    assert leaf_name((("key", 1),)) == "1"
    assert leaf_name((("key", True),)) == "True"
    assert leaf_name((("key", "1"),)) == "1"
