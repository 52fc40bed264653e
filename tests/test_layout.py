import json

from nbckpt.formats.layout import (
    COMMIT_FILE,
    METADATA_FILE,
    all_steps,
    is_complete,
    latest_step,
    parse_step,
)


def _step(root, name, *, mode=None, commit=False, meta_text=None):
    d = root / name
    d.mkdir()
    if mode is not None:
        (d / METADATA_FILE).write_text(json.dumps({"mode": mode}))
    if meta_text is not None:
        (d / METADATA_FILE).write_text(meta_text)
    if commit:
        (d / COMMIT_FILE).write_text("op\n")
    return d


def test_parse_step():
    assert parse_step("0") == 0
    assert parse_step("12") == 12
    for bad in ("012", "1.nbckpt-tmp", "-1", "x", "", "1e3"):
        assert parse_step(bad) is None


def test_only_complete_steps_are_listed(tmp_path):
    _step(tmp_path, "1", mode="rename")
    _step(tmp_path, "2", mode="commit_file", commit=True)
    _step(tmp_path, "3", mode="commit_file")  # commit-file save not committed yet
    _step(tmp_path, "4")  # no metadata at all
    _step(tmp_path, "5", meta_text="{torn")  # unreadable metadata
    _step(tmp_path, "6.nbckpt-tmp", mode="rename")  # temporary, even with metadata
    _step(tmp_path, "7.nbckpt-deleting", mode="rename")
    (tmp_path / "8").write_text("a file, not a step")
    assert all_steps(tmp_path) == [1, 2]
    assert latest_step(tmp_path) == 2
    assert not is_complete(tmp_path / "6.nbckpt-tmp")


def test_missing_root_has_no_steps(tmp_path):
    assert all_steps(tmp_path / "nope") == []
    assert latest_step(tmp_path / "nope") is None


def test_the_registry_names_each_directory_by_its_records(tmp_path):
    from nbckpt.formats.registry import LAYOUTS, STEP_FORMATS, layout_of

    assert tuple(layout.name for layout in LAYOUTS) == STEP_FORMATS == ("nbckpt", "orbax")
    ours = _step(tmp_path, "1", mode="rename")
    # nbckpt writes Orbax's records beside its own, so Orbax can read the step: still ours.
    (ours / "_CHECKPOINT_METADATA").write_text(json.dumps({"item_handlers": None}))
    orbax = tmp_path / "2"
    orbax.mkdir()
    (orbax / "_CHECKPOINT_METADATA").write_text(json.dumps({"commit_timestamp_nsecs": 1}))
    nobody = _step(tmp_path, "3")
    found = {p.name: layout_of(p) for p in (ours, orbax, nobody, tmp_path / "4")}
    assert {k: v and v.name for k, v in found.items()} == {
        "1": "nbckpt",
        "2": "orbax",
        "3": None,
        "4": None,
    }
    assert all_steps(tmp_path) == [1, 2]  # each complete by its own layout's rule


def test_every_registered_layout_has_a_reader():
    # Restore chooses its reader by the registry's name for the step; a layout added
    # to the registry without a reader would be listed but not restorable.
    from nbckpt.engine.restore.step import _READERS
    from nbckpt.formats.registry import STEP_FORMATS

    assert sorted(_READERS) == sorted(STEP_FORMATS)


def test_a_listed_steps_metadata_is_parsed_once_until_it_changes(tmp_path, monkeypatch):
    import os

    from nbckpt.formats import registry

    step = _step(tmp_path, "1", mode="rename")
    parsed = []
    read = registry.read_metadata
    monkeypatch.setattr(registry, "read_metadata", lambda p: parsed.append(p) or read(p))
    assert all_steps(tmp_path) == [1] and len(parsed) == 1
    assert all_steps(tmp_path) == [1] and latest_step(tmp_path) == 1
    assert len(parsed) == 1  # a large state's metadata is megabytes: not parsed again
    # Any change to the file is seen: cut short ...
    meta = step / METADATA_FILE
    meta.write_text(meta.read_text()[:5])
    assert all_steps(tmp_path) == [] and len(parsed) == 2
    # ... or replaced by a file of the same size (another inode).
    good = json.dumps({"mode": "rename"})
    meta.write_text(good)
    assert all_steps(tmp_path) == [1]
    (tmp_path / "other").write_text(good.replace("rename", "renamX"))
    os.replace(tmp_path / "other", meta)
    assert all_steps(tmp_path) == []


def test_a_step_this_process_published_is_listed_without_parsing_its_metadata(
    tmp_path, monkeypatch
):
    """The next save's preflight lists the root: the step just renamed is known complete.

    Changed afterwards (cut short here), it is read again, and is no longer complete.
    """
    import numpy as np

    from nbckpt.engine import AsyncCheckpointer
    from nbckpt.formats import registry

    with AsyncCheckpointer(tmp_path) as ck:
        ck.save(1, {"w": np.arange(8.0)})
        ck.wait_until_finished()
    parsed = []
    read = registry._renamed_save
    monkeypatch.setattr(registry, "_renamed_save", lambda p: parsed.append(p) or read(p))
    assert all_steps(tmp_path) == [1] and parsed == []
    meta = tmp_path / "1" / "_NBCKPT_METADATA"
    meta.write_text(meta.read_text()[:-10])
    assert all_steps(tmp_path) == [] and len(parsed) == 1
