"""Orbax reads what nbckpt writes, in either format; nbckpt writes Orbax's OCDBT format.

Steps are saved by four real JAX processes (two CPU devices each) and restored by two
(one device each) with Orbax's own ``StandardCheckpointer``: other processes, another
mesh, bit for bit.
"""

from __future__ import annotations

import base64
import json
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nbckpt.engine.arrays.zarr import chunk_key, chunk_regions
from nbckpt.formats import checksum, orbax_write
from nbckpt.formats.layout import CHECKSUMS_DIR, COMMIT_FILE, FORMAT, METADATA_FILE, all_steps
from nbckpt.formats.orbax_names import OCDBT_MANIFEST, SHARDING, TREE_METADATA
from nbckpt.journal import read_operation

T = "tests.mh_orbax_write"
OCDBT_DIRS = [f"ocdbt.process_{i}" for i in range(4)]


@pytest.fixture(scope="module")
def saved(group4, tmp_path_factory) -> dict[str, Any]:
    """One root, three steps: nbckpt's format by rename and by commit file, without packs
    (what Orbax restores), and Orbax's; and in a root of its own nbckpt's default step,
    small leaves packed."""
    root = tmp_path_factory.mktemp("orbax_write")
    unpacked = {"pack_bytes": 0}
    ops = {
        1: group4.run(f"{T}:save", str(root), 1, kwargs=unpacked)[0],
        2: group4.run(f"{T}:save", str(root), 2, kwargs={"mode": "commit_file", **unpacked})[0],
        3: group4.run(f"{T}:save", str(root), 3, kwargs={"format": "orbax"})[0],
    }
    packed = tmp_path_factory.mktemp("orbax_write_packed")
    group4.run(f"{T}:save", str(packed), 1)
    return {"root": root, "ops": ops, "packed": packed}


def _json(path: Path) -> Any:
    return json.loads(path.read_text())


# -- the records, without processes ---------------------------------------------------

LEAVES: list[dict[str, Any]] = [
    {
        "name": "params.w",
        "path": [["key", "params"], ["key", "w"]],
        "kind": "jax",
        "shape": [64, 32],
        "dtype": "float32",
        "chunks": [16, 16],
        "sharding": {
            "type": "named",
            "axis_names": ["data", "model"],
            "mesh_shape": [4, 2],
            "spec": ["data", "model"],
            "device_ids": [[0, 1], [2, 3], [4, 5], [6, 7]],
            "axis_types": ["Auto", "Auto"],
        },
    },
    {
        "name": "layers.0",
        "path": [["key", "layers"], ["index", 0]],
        "kind": "numpy",
        "shape": [3],
        "dtype": "int64",
        "chunks": [3],
        "sharding": None,
    },
    {"name": "cfg.lr", "path": [["attr", "cfg"], ["attr", "lr"]], "kind": "scalar", "value": 0.1},
]


def test_tree_metadata_is_what_orbax_parses():
    from orbax.checkpoint._src.metadata import tree as ocp_tree

    flags = orbax_write.OrbaxFlags(use_ocdbt=False, use_zarr3=False)
    data = orbax_write.tree_metadata(LEAVES, flags)
    assert data["store_array_data_equal_to_fill_value"] is True
    entries = data["tree_metadata"]
    assert list(entries) == ["('params', 'w')", "('layers', '0')", "('cfg', 'lr')"]
    assert entries["('layers', '0')"]["key_metadata"] == [
        {"key": "layers", "key_type": 2},
        {"key": "0", "key_type": 1},
    ]
    w = entries["('params', 'w')"]["value_metadata"]
    assert w == {"value_type": "jax.Array", "skip_deserialize": False, "write_shape": [16, 16]}
    # A Python number without a 0-d array has nothing for Orbax to read.
    assert entries["('cfg', 'lr')"]["value_metadata"]["skip_deserialize"] is True
    parsed = ocp_tree.InternalTreeMetadata.from_json(data)
    assert parsed.use_ocdbt is False and parsed.store_array_data_equal_to_fill_value
    tree = parsed.as_nested_tree()
    assert tree["params"]["w"].value_type == "jax.Array"
    assert tree["layers"][0].value_type == "np.ndarray"


def test_sharding_records_are_what_orbax_parses():
    from orbax.checkpoint._src.metadata import sharding as ocp_sharding

    records = orbax_write.sharding_records(LEAVES)
    key = base64.urlsafe_b64encode(b"params.w").decode()
    assert list(records) == [key]  # jax arrays only
    meta = ocp_sharding.from_serialized_string(records[key])
    assert list(meta.shape) == [4, 2] and meta.axis_names == ["data", "model"]
    assert meta.partition_spec == ("data", "model")
    assert meta.device_mesh is not None and meta.device_mesh.mesh[3][1].id == 7
    files = orbax_write.orbax_records(LEAVES, orbax_write.OrbaxFlags(use_ocdbt=1, use_zarr3=1))
    assert set(files) == {TREE_METADATA, SHARDING}


def test_which_leaves_orbax_finds():
    assert orbax_write.orbax_readable(LEAVES[0])
    odd = {"name": "a%2Eb", "path": [["key", "a.b"]], "kind": "jax"}
    assert not orbax_write.orbax_readable(odd)  # nbckpt percent-encodes the '.'
    assert orbax_write.scalar_array_dtype(True) == "bool"
    assert orbax_write.scalar_array_dtype(2**70) is None
    assert orbax_write.scalar_array_dtype(1.5) == "float64"


# -- nbckpt's own format --------------------------------------------------------------


@pytest.mark.multihost
@pytest.mark.parametrize("step", [1, 2])
def test_every_nbckpt_step_carries_orbax_records(saved, step):
    path = saved["root"] / str(step)
    meta = _json(path / TREE_METADATA)
    assert meta["use_ocdbt"] is False and meta["use_zarr3"] is False
    assert meta["store_array_data_equal_to_fill_value"] is True
    assert set(meta["tree_metadata"]) == {
        "('params', 'w')",
        "('params', 'b')",
        "('z',)",
        "('host',)",
        "('lr',)",
        "('step',)",
        "('flag',)",
    }
    shardings = _json(path / SHARDING)
    names = {base64.urlsafe_b64decode(k).decode() for k in shardings}
    assert names == {"params.w", "params.b", "z"}
    # Python numbers are 0-d arrays as well (Orbax reads them there) ...
    for name in ("lr", "step", "flag"):
        assert (path / name / ".zarray").is_file()
    # ... and nbckpt's metadata still holds them inline, and no "arrays" field.
    nb = _json(path / METADATA_FILE)
    assert nb["format"] == FORMAT and "arrays" not in nb
    assert {leaf["name"]: leaf.get("value") for leaf in nb["leaves"]}["lr"] == 0.001


@pytest.mark.multihost
@pytest.mark.parametrize("step", [1, 2, 3])
def test_orbax_restores_nbckpt_steps_bit_identical(group2, saved, step):
    path = str(saved["root"] / str(step))
    assert group2.run(f"{T}:orbax_restore_check", path) == [[]] * 2


@pytest.mark.multihost
def test_orbax_refuses_a_step_with_packed_leaves_rather_than_misread_it(group2, saved):
    path = saved["packed"] / "1"
    assert (path / "_PACKED").is_dir() and not (path / "_METADATA").exists()
    for error in group2.run(f"{T}:orbax_restore_error", str(path)):
        assert error and "zeros" not in error and "other values" not in error, error
    assert group2.run(f"{T}:nbckpt_restore_check", str(saved["packed"]), 1) == [[]] * 2


@pytest.mark.multihost
def test_a_deleted_chunk_fails_orbax_restore(group2, saved, tmp_path):
    """Every chunk is stored, so Orbax is told a missing one is an error, not zeros."""
    step = tmp_path / "1"
    shutil.copytree(saved["root"] / "1", step)
    assert group2.run(f"{T}:orbax_restore_error", str(step)) == ["", ""]
    (step / "params.w" / "0.0").unlink()
    errors = group2.run(f"{T}:orbax_restore_error", str(step))
    for error in errors:
        assert error and "zeros" not in error
        assert "NOT_FOUND" in error and "params.w" in error, error


# -- Orbax's format -------------------------------------------------------------------


@pytest.mark.multihost
def test_orbax_format_layout(saved):
    path = saved["root"] / "3"
    nb = _json(path / METADATA_FILE)
    assert nb["format"] == FORMAT and nb["arrays"] == "ocdbt+zarr3"
    meta = _json(path / TREE_METADATA)
    assert meta["use_ocdbt"] is True and meta["use_zarr3"] is True
    assert (path / OCDBT_MANIFEST).is_file()
    assert sorted(p.name for p in path.glob("ocdbt.process_*")) == OCDBT_DIRS
    assert not (path / "params.w").exists()  # the arrays live in the databases
    assert sorted(p.name for p in (path / CHECKSUMS_DIR).iterdir()) == [
        f"process_{i}.json" for i in range(4)
    ]


@pytest.mark.multihost
def test_orbax_format_journal_and_bytes(saved):
    rec = read_operation(saved["root"], saved["ops"][3])
    assert rec.status == "committed" and sorted(rec.processes) == [0, 1, 2, 3]
    nb = _json(saved["root"] / "3" / METADATA_FILE)
    stored = sum(
        math.prod(leaf["shape"]) * np.dtype(leaf["dtype"]).itemsize
        for leaf in nb["leaves"]
        if "chunks" in leaf
    )
    assert sum(p.bytes_written for p in rec.processes.values()) == stored


def _open_orbax_array(step: Path, name: str) -> Any:
    import tensorstore as ts

    from nbckpt.engine.arrays.ocdbt_writer import kvstore_spec, new_context

    spec = {
        "driver": "zarr3",
        "kvstore": {**kvstore_spec(step, write=False), "path": name},
        "fill_missing_data_reads": False,
    }
    return ts.open(spec, open=True, context=new_context()).result()


@pytest.mark.multihost
def test_orbax_format_chunks_match_their_checksums(saved):
    """Read every chunk of the merged database back; each matches the CRC recorded."""
    step = saved["root"] / "3"
    recorded = checksum.read_checksums(step)
    assert recorded is not None
    leaves = [leaf for leaf in _json(step / METADATA_FILE)["leaves"] if "chunks" in leaf]
    assert {leaf["name"] for leaf in leaves} == set(recorded)
    checked = 0
    for leaf in leaves:
        store = _open_orbax_array(step, leaf["name"])
        whole = tuple(slice(0, d) for d in leaf["shape"])
        for region, _ in chunk_regions(whole, leaf["shape"], leaf["chunks"]):
            algorithm, value = recorded[leaf["name"]][chunk_key(region, leaf["chunks"])]
            assert checksum.checksum(store[region].read().result(), algorithm) == value
            checked += 1
    assert checked == sum(len(v) for v in recorded.values())


@pytest.mark.multihost
def test_orbax_format_in_commit_file_mode(group4, group2, tmp_path):
    group4.run(f"{T}:save", str(tmp_path), 5, kwargs={"mode": "commit_file", "format": "orbax"})
    assert all_steps(tmp_path) == [5] and (tmp_path / "5" / COMMIT_FILE).is_file()
    assert group2.run(f"{T}:orbax_restore_check", str(tmp_path / "5")) == [[]] * 2


@pytest.mark.multihost
def test_orbax_format_save_that_fails_commits_nothing(group4, tmp_path):
    group4.run("tests.mh_tasks:arm_fault", 2, "fail-io", kwargs={"at": "write"})
    try:
        errors = group4.run(f"{T}:save_error", str(tmp_path), 4, kwargs={"format": "orbax"})
    finally:
        group4.run("tests.mh_tasks:clear_hooks")
    assert all(e is not None and "injected I/O error" in e for e in errors), errors
    assert all_steps(tmp_path) == [] and not (tmp_path / "4").exists()


@pytest.mark.multihost
def test_nbckpt_restores_orbax_format_and_checks_every_chunk(group2, saved, tmp_path):
    assert group2.run(f"{T}:nbckpt_restore_check", str(saved["root"]), 3) == [[]] * 2
    shutil.copytree(saved["root"] / "3", tmp_path / "3")
    sums = tmp_path / "3" / CHECKSUMS_DIR / "process_0.json"
    data = _json(sums)
    leaf = next(k for k in data if k.startswith("params."))
    key = next(iter(data[leaf]))
    data[leaf][key] ^= 1
    sums.write_text(json.dumps(data))
    errors = group2.run(f"{T}:nbckpt_restore_error", str(tmp_path), 3)
    # The process that reads that chunk fails (the other may not need it).
    assert any(
        e.startswith("CorruptCheckpointError") and f"chunk {key} does not match" in e
        for e in errors
    ), errors


def test_unknown_format_is_refused(tmp_path):
    from nbckpt.engine import AsyncCheckpointer

    with pytest.raises(ValueError, match="format must be one of 'nbckpt', 'orbax'"):
        AsyncCheckpointer(tmp_path, format="zarr")
    with pytest.raises(ValueError, match="format must be one of"):
        AsyncCheckpointer(tmp_path).save(1, {"x": 1}, format="ocdbt")
    assert not list(tmp_path.iterdir())


# -- Orbax's CheckpointManager --------------------------------------------------------


@pytest.mark.multihost
def test_orbax_checkpoint_manager_lists_but_cannot_restore(group2, saved):
    """CheckpointManager lists nbckpt steps; it restores only ``<step>/<item>/`` items.

    nbckpt's step directory is itself the pytree (Orbax's ``StandardCheckpointer``
    layout), so the manager takes each leaf directory for an item; restoring the
    directory it lists with ``StandardCheckpointer`` works.
    """
    out = group2.run(f"{T}:orbax_manager", str(saved["root"]))[0]
    assert out["all_steps"] == [1, 2, 3] and out["latest"] == 3
    errors = out["errors"]
    assert "could not be restored" in errors["bare"] or "not found" in errors["bare"]
    assert "Composite" in errors["standard"]
    assert 'Item "default" was not found' in errors["default"]
    assert out["via_directory"] == []


def test_orbax_readable_names_match_leaf_names():
    from nbckpt.engine.arrays.tree import flatten

    leaves = flatten({"params": {"w": 1.0}, "layers": [2, {"k-1_x": 3}], "a.b": 4, "é": 5})
    readable = {
        leaf.name: orbax_write.orbax_readable(
            {"name": leaf.name, "path": [list(p) for p in leaf.path]}
        )
        for leaf in leaves
    }
    assert readable == {
        "params.w": True,
        "layers.0": True,
        "layers.1.k-1_x": True,
        "a%2Eb": False,
        "%C3%A9": False,
    }


def test_zero_d_arrays_have_one_chunk_key():
    assert chunk_key((), []) == "0"
    assert [r for r, _ in chunk_regions((), [], [])] == [()]
