"""The file and directory names of Orbax's on-disk layout (orbax-checkpoint 0.12).

Shared by the reader (:mod:`nbckpt.formats.orbax`) and the writer
(:mod:`nbckpt.formats.orbax_write`); nothing else spells them.
"""

from __future__ import annotations

__all__ = [
    "ARRAY_METADATAS_DIR",
    "CHECKPOINT_METADATA",
    "COMMIT_SUCCESS",
    "OCDBT_MANIFEST",
    "OCDBT_PROCESS_PREFIX",
    "SHARDING",
    "STRINGS",
    "TMP_SUFFIX",
    "TREE_METADATA",
]

#: A pytree item's tree metadata: ``{"tree_metadata": ..., "use_ocdbt": ..., ...}``.
TREE_METADATA = "_METADATA"
#: Each array leaf's sharding, keyed by the base64 of its dotted name.
SHARDING = "_sharding"
#: The step's (or a pytree checkpoint's) metadata: item handlers, timestamps, metrics.
CHECKPOINT_METADATA = "_CHECKPOINT_METADATA"
#: Written last where rename is not atomic, and (since 0.12) before every rename too.
COMMIT_SUCCESS = "commit_success.txt"
#: ``<name>.orbax-checkpoint-tmp`` or ``<name>.orbax-checkpoint-tmp-<timestamp>``.
TMP_SUFFIX = ".orbax-checkpoint-tmp"
#: The merged OCDBT database's manifest, in an item directory.
OCDBT_MANIFEST = "manifest.ocdbt"
#: Each process's own OCDBT database before the merge: ``ocdbt.process_<i>/``.
OCDBT_PROCESS_PREFIX = "ocdbt.process_"
#: Per-process array metadata: ``array_metadatas/process_<i>``.
ARRAY_METADATAS_DIR = "array_metadatas"
#: A pytree item's string leaves: one JSON object, keyed by each leaf's dotted name.
STRINGS = "_strings.json"
