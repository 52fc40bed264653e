"""nbckpt reads what Orbax writes, and never takes one kind for the other.

Every Orbax checkpoint here is written by real orbax-checkpoint: in this process for
the layout, inventory and fsck tests; by four real JAX processes (``group4``) for the
restores, which nbckpt then runs in two (``group2``) or four.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from nbckpt.engine import AsyncCheckpointer
from nbckpt.engine.restore.step import restore_step
from nbckpt.errors import CorruptCheckpointError, ForeignEntryError, StepExistsError
from nbckpt.formats import orbax
from nbckpt.formats.fsck import ORBAX_NOT_VERIFIED, fsck
from nbckpt.formats.inventory import classify, list_steps
from nbckpt.formats.layout import all_steps, entry_state, is_complete, latest_step, step_format
from nbckpt.formats.orbax_names import CHECKPOINT_METADATA, COMMIT_SUCCESS, TREE_METADATA
from nbckpt.server.manager import CheckpointManager

M = "tests.mh_orbax"


def _tree(k: float = 1.0) -> dict[str, Any]:
    """A tree with every kind of node Orbax records: nested dicts, a list, a tuple,
    jax and NumPy arrays, Python scalars and an empty dict."""
    return {
        "params": {
            "w": jax.numpy.arange(48.0, dtype=jax.numpy.float32).reshape(6, 8) * k,
            "layers": [np.arange(5, dtype=np.int16), np.full((2, 3), k, np.float64)],
        },
        "pair": (3, 0.5),
        "flag": True,
        "empty": {},
    }


def _orbax_std(path: Path, k: float = 1.0) -> Path:
    ck = ocp.StandardCheckpointer()
    ck.save(path, _tree(k))
    ck.wait_until_finished()
    return path


def _orbax_pytree(path: Path, **options: Any) -> Path:
    ocp.Checkpointer(ocp.PyTreeCheckpointHandler(**options)).save(path, _tree())
    return path


def _orbax_manager(root: Path, steps: tuple[int, ...], **kw: Any) -> None:
    with ocp.CheckpointManager(root, **kw) as mgr:
        for step in steps:
            mgr.save(step, args=ocp.args.StandardSave(_tree(step)))
            mgr.wait_until_finished()


def _nb_save(
    root: Path, step: int, k: float = 1.0, *, max_to_keep: int | None = None, **kw: Any
) -> None:
    with AsyncCheckpointer(root, max_to_keep=max_to_keep) as ck:
        ck.save(step, {"w": jax.numpy.ones((4, 4)) * k, "n": np.arange(3)}, **kw)


def _listing(path: Path) -> list[tuple[str, int]]:
    return sorted(
        (str(p.relative_to(path)), p.stat().st_size if p.is_file() else -1) for p in path.rglob("*")
    )


def _same(a: Any, b: Any) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# --- the format: names, key paths, items, completion ----------------------------------


def test_tree_leaves_name_and_path_every_leaf_as_orbax_does(tmp_path: Path) -> None:
    path = _orbax_std(tmp_path / "std")
    leaves = {leaf.name: leaf for leaf in orbax.tree_leaves(path)}
    assert set(leaves) == {
        "params.w",
        "params.layers.0",
        "params.layers.1",
        "pair.0",
        "pair.1",
        "flag",
        "empty",
    }
    assert leaves["params.layers.1"].path == (("key", "params"), ("key", "layers"), ("index", 1))
    assert leaves["pair.0"].path == (("key", "pair"), ("index", 0))
    assert leaves["params.w"].value_type == "jax.Array" and leaves["params.w"].is_array
    assert leaves["params.layers.0"].value_type == "np.ndarray"
    assert leaves["pair.1"].value_type == "scalar" and leaves["pair.1"].is_array
    assert leaves["empty"].is_empty and not leaves["empty"].is_array
    assert leaves["empty"].empty_value() == {}
    # The names are the ones Orbax's own metadata gives its leaves.
    meta = ocp.StandardCheckpointer().metadata(path).item_metadata
    flat = jax.tree_util.tree_flatten_with_path(meta)[0]
    theirs = {".".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in kp) for kp, _ in flat}
    assert theirs <= set(leaves)


@pytest.mark.parametrize(
    ("options", "ocdbt", "zarr3"),
    [({}, True, False), ({"use_ocdbt": False}, False, False), ({"use_zarr3": True}, True, True)],
)
def test_describe_reads_the_array_flags(
    tmp_path: Path, options: dict[str, Any], ocdbt: bool, zarr3: bool
) -> None:
    path = _orbax_pytree(tmp_path / "1", **options)
    found = orbax.describe(path)
    assert found is not None and found.state == "complete", found
    (item,) = found.items
    assert item.name is None and item.kind == "pytree"
    assert (found.ocdbt, found.zarr3) == (ocdbt, zarr3)
    assert item.tree is not None and item.tree.store_equal_to_fill
    assert step_format(path) == "orbax" and is_complete(path)


def test_manager_steps_list_their_items(tmp_path: Path) -> None:
    with ocp.CheckpointManager(tmp_path, item_names=("a", "b", "meta")) as mgr:
        mgr.save(
            3,
            args=ocp.args.Composite(
                a=ocp.args.StandardSave({"x": np.arange(3)}),
                b=ocp.args.StandardSave({"y": np.arange(4)}),
                meta=ocp.args.JsonSave({"note": 1}),
            ),
        )
        mgr.wait_until_finished()
    found = orbax.describe(tmp_path / "3")
    assert found is not None and found.state == "complete"
    assert [(i.name, i.kind) for i in found.items] == [
        ("a", "pytree"),
        ("b", "pytree"),
        ("meta", "json"),
    ]
    with pytest.raises(ValueError, match=r"several pytree items \('a', 'b'\).*item="):
        found.item()
    listing = r"its items: a \(pytree\), b \(pytree\), meta \(json\)"
    with pytest.raises(KeyError, match=rf"no item 'c'; {listing}"):
        found.item("c")
    with pytest.raises(ValueError, match=r"'meta' .* is not a pytree"):
        found.item("meta")
    assert found.item("b").directory == tmp_path / "3" / "b"


def test_completion_rule(tmp_path: Path) -> None:
    _orbax_manager(tmp_path / "m", (1,))
    step = tmp_path / "m" / "1"
    assert (step / COMMIT_SUCCESS).is_file() and is_complete(step)
    # Older Orbax only renamed, stamping the commit time first: complete without the file.
    renamed = tmp_path / "m" / "2"
    shutil.copytree(step, renamed)
    (renamed / COMMIT_SUCCESS).unlink()
    assert is_complete(renamed)
    # A step written in place that never got its commit stamp nor its file: incomplete.
    meta = json.loads((renamed / CHECKPOINT_METADATA).read_text())
    del meta["commit_timestamp_nsecs"]
    (renamed / CHECKPOINT_METADATA).write_text(json.dumps(meta))
    assert not is_complete(renamed)
    assert orbax.describe(renamed).state == "incomplete"  # type: ignore[union-attr]
    # Orbax 0.12 writes commit_success.txt before its rename: a temporary directory
    # holds one, and is never a step.
    tmp = tmp_path / "m" / "3.orbax-checkpoint-tmp-1716"
    shutil.copytree(step, tmp)
    assert (tmp / COMMIT_SUCCESS).is_file()
    assert not is_complete(tmp) and not orbax.is_complete(tmp)
    assert orbax.tmp_target(tmp.name) == "3" and orbax.tmp_target("3.orbax-checkpoint-tmp") == "3"
    assert orbax.tmp_target("3") is None
    # A commit file alone (nobody's records) makes no step of a folder.
    stray = tmp_path / "m" / "4"
    stray.mkdir()
    (stray / COMMIT_SUCCESS).write_text("op\n")
    assert step_format(stray) is None and not is_complete(stray)
    assert all_steps(tmp_path / "m") == [1]


def test_describe_unknown_names_what_is_there(tmp_path: Path) -> None:
    d = tmp_path / "7"
    d.mkdir()
    assert orbax.describe(d) is None
    assert orbax.describe_unknown(d) == (
        "neither an nbckpt nor an Orbax step: found nothing (an empty directory)"
    )
    for name in ("notes.txt", "b", "a", "c", "d", "e", "f"):
        (d / name).write_text("x")
    assert orbax.describe_unknown(d) == (
        "neither an nbckpt nor an Orbax step: found a, b, c, d, e and 2 more"
    )


# --- a root holding both kinds ------------------------------------------------------


@pytest.fixture
def mixed(tmp_path: Path) -> Path:
    """nbckpt steps 1, 2, 4; Orbax manager steps 3, 5; Orbax's leftovers; strangers."""
    root = tmp_path / "root"
    _orbax_manager(root, (3, 5))
    _nb_save(root, 1)
    _nb_save(root, 2, 2.0, mode="commit_file")
    _nb_save(root, 4, 4.0)
    shutil.copytree(root / "5", root / "6.orbax-checkpoint-tmp-1716")  # a save mid-rename
    unknown = root / "7"
    unknown.mkdir()
    (unknown / "notes.txt").write_text("mine")
    stray = root / "8"  # a stranger's folder with a commit file in it
    stray.mkdir()
    (stray / COMMIT_SUCCESS).write_text("op\n")
    half = root / "9"  # an Orbax save in place that died before its commit
    shutil.copytree(root / "5", half)
    (half / COMMIT_SUCCESS).unlink()
    meta = json.loads((half / CHECKPOINT_METADATA).read_text())
    del meta["commit_timestamp_nsecs"]
    (half / CHECKPOINT_METADATA).write_text(json.dumps(meta))
    return root


def test_mixed_root_lists_complete_steps_of_both_kinds_only(mixed: Path) -> None:
    assert all_steps(mixed) == [1, 2, 3, 4, 5]
    assert latest_step(mixed) == 5
    kinds = {n: step_format(mixed / n) for n in ("1", "2", "3", "5", "7", "8", "9")}
    assert kinds == {
        "1": "nbckpt",
        "2": "nbckpt",
        "3": "orbax",
        "5": "orbax",
        "7": None,
        "8": None,
        "9": "orbax",
    }
    # Nothing Orbax wrote, nor a stranger's folder, is ever nbckpt's to touch.
    for name in ("3", "5", "7", "8", "9", "6.orbax-checkpoint-tmp-1716"):
        assert entry_state(mixed / name) == "foreign", name
    assert entry_state(mixed / "4") == "complete"


def test_inventory_of_a_mixed_root(mixed: Path) -> None:
    entries = {e.path: e for e in classify(mixed, stale_after_s=0)}
    got = {p: (e.state, e.format) for p, e in entries.items()}
    assert got == {
        "1": ("complete", "nbckpt"),
        "2": ("complete", "nbckpt"),
        "3": ("complete", "orbax"),
        "4": ("complete", "nbckpt"),
        "5": ("complete", "orbax"),
        "6.orbax-checkpoint-tmp-1716": ("foreign", "orbax"),
        "7": ("foreign", None),
        "8": ("foreign", None),
        "9": ("foreign", "orbax"),
    }
    assert entries["3"].reason.startswith("Orbax step (default: 7 leaves, OCDBT, zarr v2")
    assert entries["5"].process_count == 1
    assert entries["5"].time > entries["3"].time > 1e9  # Orbax's commit times
    assert "found notes.txt" in entries["7"].reason
    assert "did not finish" in entries["9"].reason
    rows = {r["path"].rsplit("/", 1)[-1]: r for r in list_steps(mixed)}
    assert rows["3"]["format"] == "orbax" and rows["1"]["format"] == "nbckpt"


def test_fsck_cleans_nothing_of_orbax_and_says_what_it_cannot_verify(mixed: Path) -> None:
    before = {n: _listing(mixed / n) for n in ("3", "5", "6.orbax-checkpoint-tmp-1716", "9")}
    report = fsck(mixed, clean=True, verify=True, stale_after_s=0)
    assert report.removed == []
    assert {n: _listing(mixed / n) for n in before} == before
    by_path = {e.path: e for e in report.entries}
    assert by_path["3"].state == "complete"
    assert by_path["3"].reason.endswith(ORBAX_NOT_VERIFIED)
    assert "every chunk is there" in by_path["3"].reason
    assert "not verified" not in by_path["1"].reason  # nbckpt's own steps are verified
    assert "0 corrupt" in report.table()


def test_retention_and_force_never_touch_orbax_steps(mixed: Path) -> None:
    before = {n: _listing(mixed / n) for n in ("3", "5", "9")}
    for mode in ("rename", "commit_file"):
        for force in (False, True):
            with pytest.raises(ForeignEntryError, match="not created by nbckpt"):
                _nb_save(mixed, 3, mode=mode, force=force)
    with pytest.raises(ForeignEntryError):
        _nb_save(mixed, 9, force=True)  # an unfinished Orbax save is not ours either
    _nb_save(mixed, 10, 10.0, max_to_keep=1)
    assert all_steps(mixed) == [3, 5, 10]  # nbckpt's older steps went, Orbax's stayed
    assert {n: _listing(mixed / n) for n in before} == before
    with pytest.raises(StepExistsError):
        _nb_save(mixed, 10)


def test_restore_latest_orbax_step_in_this_process(mixed: Path) -> None:
    with AsyncCheckpointer(mixed) as ck:
        out = ck.restore()  # the latest is Orbax's step 5
        ours = ck.restore(4)
    mine = ocp.StandardCheckpointer().restore(mixed / "5" / "default")
    assert _same(out["params"]["w"], mine["params"]["w"])
    assert _same(out["params"]["w"], _tree(5)["params"]["w"])
    assert isinstance(out["params"]["w"], jax.Array)
    layers = zip(out["params"]["layers"], _tree(5)["params"]["layers"], strict=True)
    assert [_same(a, b) for a, b in layers] == [True, True]
    assert type(out["params"]["layers"][0]) is np.ndarray
    assert out["pair"] == [3, 0.5] and [type(v) for v in out["pair"]] == [int, float]
    assert out["flag"] is True and out["empty"] == {}
    assert _same(ours["w"], np.ones((4, 4), np.float32) * 4)


def test_server_lists_the_format(mixed: Path) -> None:
    data = CheckpointManager(mixed.parent).checkpoints("root")
    formats = {e["path"]: e["format"] for e in data["entries"]}
    assert formats["3"] == "orbax" and formats["4"] == "nbckpt" and formats["7"] is None
    assert data["counts"] == {"complete": 5, "foreign": 4}
    json.dumps(data)


# --- damage ---------------------------------------------------------------------------


def test_a_missing_chunk_is_an_error_not_zeros(tmp_path: Path) -> None:
    root = tmp_path / "r"
    path = _orbax_pytree(root / "1", use_ocdbt=False)
    (path / "params.w" / "0.0").unlink()
    with pytest.raises(CorruptCheckpointError, match=r"params\.w.*missing.*no checksums"):
        restore_step(path, None)
    report = fsck(root, verify=True)
    (entry,) = report.entries
    assert entry.state == "corrupt" and "params.w: chunk at [0, 0] missing" in entry.reason
    assert report.removed == []


def test_without_store_equal_to_fill_a_missing_chunk_reads_as_fill(tmp_path: Path) -> None:
    """The limit the docs state: an older Orbax step cannot tell a missing chunk from
    one of fill values (zeros), and fsck says it could not check."""
    root = tmp_path / "r"
    path = _orbax_pytree(root / "1", use_ocdbt=False)
    meta = json.loads((path / TREE_METADATA).read_text())
    meta["store_array_data_equal_to_fill_value"] = False
    (path / TREE_METADATA).write_text(json.dumps(meta))
    (path / "params.w" / "0.0").unlink()
    out = restore_step(path, None)
    assert not np.asarray(out["params"]["w"]).any()
    (entry,) = fsck(root, verify=True).entries
    assert entry.state == "complete" and "cannot be told from fill values" in entry.reason


def test_damaged_orbax_records_make_a_corrupt_entry_never_cleaned(tmp_path: Path) -> None:
    root = tmp_path / "r"
    _orbax_manager(root, (1,))
    (root / "1" / "default" / TREE_METADATA).write_text("{torn")
    (entry,) = classify(root)
    assert (entry.state, entry.format) == ("corrupt", "orbax")
    assert "default" in entry.reason and TREE_METADATA in entry.reason
    assert all_steps(root) == [1]  # committed all the same: listed, not hidden
    with pytest.raises(CorruptCheckpointError):
        restore_step(root / "1", None)
    report = fsck(root, clean=True, stale_after_s=0)
    assert report.removed == [] and (root / "1" / "default").is_dir()


def test_nbckpt_steps_in_orbax_layout_stay_nbckpt_steps_and_are_verified(tmp_path: Path) -> None:
    """A step nbckpt saved in Orbax's array layout carries Orbax's records too; it is
    still nbckpt's (listed, verified, cleaned by nbckpt's rules), read through OCDBT."""
    from nbckpt.formats.orbax_names import OCDBT_MANIFEST
    from nbckpt.journal import read_operation

    tree = {"w": jax.numpy.arange(64.0).reshape(8, 8), "n": np.arange(3)}
    with AsyncCheckpointer(tmp_path, format="orbax") as ck:
        ck.save(1, tree)
        ck.wait_until_finished()
        out = ck.restore(1)
        assert ck.last_op is not None
        events = read_operation(tmp_path, ck.last_op).processes[0].events
    assert _same(out["w"], tree["w"]) and _same(out["n"], tree["n"])
    assert [e["verified"] for e in events if e["event"] == "read_done"] == [True]
    assert (tmp_path / "1" / TREE_METADATA).is_file()  # Orbax's records are there too
    assert step_format(tmp_path / "1") == "nbckpt" and entry_state(tmp_path / "1") == "complete"
    (entry,) = fsck(tmp_path, verify=True).entries
    assert (entry.state, entry.format) == ("complete", "nbckpt")
    (tmp_path / "1" / OCDBT_MANIFEST).rename(tmp_path / "manifest.aside")
    (entry,) = classify(tmp_path)
    assert entry.state == "corrupt" and OCDBT_MANIFEST in entry.reason


def test_item_is_refused_for_an_nbckpt_step(tmp_path: Path) -> None:
    _nb_save(tmp_path, 1)
    with pytest.raises(ValueError, match="nbckpt step, which holds one tree"):
        restore_step(tmp_path / "1", None, item="default")


# --- four processes save with Orbax; nbckpt restores in two or four --------------------

ORBAX_KINDS = ("standard", "no_ocdbt", "zarr3", "manager")


@pytest.fixture(scope="module")
def orbax4(group4: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """One root per Orbax layout, each saved by four processes (eight devices)."""
    roots = {}
    for i, how in enumerate((*ORBAX_KINDS, "manager_items"), start=1):
        root = str(tmp_path_factory.mktemp(how))
        group4.run(f"{M}:orbax_save", root, how, i)
        roots[how] = root
    return roots


def _step_of(how: str) -> int:
    return (*ORBAX_KINDS, "manager_items").index(how) + 1


@pytest.mark.multihost
@pytest.mark.parametrize("how", ORBAX_KINDS)
def test_two_processes_restore_what_four_saved_reading_only_their_part(
    group2: Any, orbax4: dict[str, str], how: str
) -> None:
    root, step = orbax4[how], _step_of(how)
    assert all_steps(root) == [step]
    found = orbax.describe(Path(root) / str(step))
    assert found is not None and found.state == "complete"
    assert found.process_count == 4
    # Orbax's chunks of z are 2 rows by all 8 columns: the target below gives each
    # process 4 columns, which would read every chunk whole if reads were widened.
    (item,) = found.pytree_items()
    assert item.tree is not None
    z = next(leaf for leaf in item.tree.leaves if leaf.name == "stats.z")
    assert z.write_shape == (2, 8)
    results = group2.run(f"{M}:nb_restore", root, step, step, "sharded")
    for r in results:
        assert r["problems"] == []
        assert r["verified"] is False
        assert r["read"] == r["needed"] < r["whole"]
        assert r["specs"] == {"w": ["x", "None"], "b": [], "z": ["None", "x"]}
    # Without a target the 8-device mesh cannot be rebuilt on 2: replicated, whole.
    for r in group2.run(f"{M}:nb_restore", root, None, step, None):
        assert r["problems"] == [] and r["read"] == r["whole"]
        assert r["specs"] == {"w": [], "b": [], "z": []}
        assert r["types"] == {"w": "ArrayImpl", "host": "ndarray"}


@pytest.mark.multihost
def test_four_processes_get_orbax_sharding_back_without_a_target(
    group4: Any, orbax4: dict[str, str]
) -> None:
    root, step = orbax4["standard"], _step_of("standard")
    for r in group4.run(f"{M}:nb_restore", root, step, step, None):
        assert r["problems"] == []
        assert r["specs"] == {"w": ["data", "model"], "b": [], "z": ["None", "None"]}
        assert r["read"] == r["needed"] < r["whole"]  # a quarter of w, all of b and z


@pytest.mark.multihost
def test_manager_with_several_items_needs_item(group2: Any, orbax4: dict[str, str]) -> None:
    root, step = orbax4["manager_items"], _step_of("manager_items")
    errors = group2.run(f"{M}:nb_restore_error", root, step, None)
    assert errors == [errors[0]] * 2
    assert "several pytree items ('other', 'state')" in errors[0]
    assert errors[0].startswith("ValueError")
    for r in group2.run(f"{M}:nb_restore", root, step, step, "sharded", "state"):
        assert r["problems"] == [] and r["read"] == r["needed"]
    assert group2.run(f"{M}:nb_restore_other", root, step) == [[], []]
    missing = group2.run(f"{M}:nb_restore_error", root, step, None, "nope")[0]
    assert missing.startswith("KeyError") and "its items: meta (json), other (pytree)" in missing
    json_item = group2.run(f"{M}:nb_restore_error", root, step, None, "meta")[0]
    assert "is not a pytree" in json_item


@pytest.mark.multihost
@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ("shape", r"ValueError: target leaf 'params.w' has shape \(32, 32\), saved shape is"),
        ("dtype", r"ValueError: target leaf 'params.w' asks for dtype float16.*cast=True"),
        ("missing", r"KeyError: .*target leaf 'params.nope' is not in the Orbax checkpoint"),
    ],
)
def test_a_target_that_does_not_match_is_refused_naming_the_leaf(
    group2: Any, orbax4: dict[str, str], change: str, expected: str
) -> None:
    import re

    root, step = orbax4["standard"], _step_of("standard")
    errors = group2.run(f"{M}:nb_restore_error", root, step, {"change": change})
    assert all(re.search(expected, e) for e in errors), errors


def test_nothing_here_imports_jax_on_the_notebook_side() -> None:
    import subprocess
    import sys

    code = (
        "import sys, nbckpt.formats.orbax, nbckpt.formats.layout, nbckpt.formats.inventory,"
        " nbckpt.formats.fsck;"
        "print(sorted(m for m in ('jax', 'tensorstore') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ
    )
    assert out.stdout.strip() == "[]"
