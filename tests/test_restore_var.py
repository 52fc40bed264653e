"""Restoring into a notebook variable on real engines: the variable is the target."""

from __future__ import annotations

from pathlib import Path

import pytest

T = "tests.mh_restorevar"


@pytest.mark.multihost
def test_shape_dtype_struct_leaves_come_back_as_arrays_laid_out_as_asked(
    group1, tmp_path: Path
) -> None:
    [out] = group1.run(f"{T}:save_then_restore_into", str(tmp_path), "structs")
    assert out["error"] is None
    # Not a host ndarray: an array with the sharding the variable asked for.
    assert out["w_type"] != "ndarray"
    assert "spec=P('x',)" in out["w_sharding"]
    assert out["w"] == list(range(8))
    assert out["n_dtype"] == "int32"


@pytest.mark.multihost
@pytest.mark.parametrize(
    ("existing", "words"),
    [("other_dtype", "saved as float32"), ("host_other_dtype", "saved as int32")],
)
def test_a_variable_of_another_dtype_is_refused_and_left_as_it_was(
    group1, tmp_path: Path, existing: str, words: str
) -> None:
    [out] = group1.run(f"{T}:save_then_restore_into", str(tmp_path), existing)
    assert out["error"] is not None and words in out["error"], out
    assert "\n" not in out["error"]
    assert out["unchanged"]


@pytest.mark.multihost
def test_keyed_restores_and_rollbacks_are_matched_by_key_not_by_the_order_of_calls(
    group2, tmp_path: Path
) -> None:
    # The notebook sends every call a key so that a call that reached only some engines
    # cannot put them out of step; a restore and a rollback used to drop it.
    outs = group2.run(f"{T}:out_of_step", str(tmp_path))
    for out in outs:
        assert out["error"] is None, out
        start = out["index"] or 0
        assert out["w"] == list(range(start, start + 4))
        assert out["removed"] == [2]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.isdigit()) == ["1"]
