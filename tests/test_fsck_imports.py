"""Pin: ``nbckpt.formats.fsck`` imports without jax (the CLI and the lab run it jax-free)."""

import subprocess
import sys


def test_fsck_imports_without_jax() -> None:
    code = "import nbckpt.formats.fsck, sys; assert 'jax' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
