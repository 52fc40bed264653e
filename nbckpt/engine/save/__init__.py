"""A save: preflight, snapshot, background write, commit, retention."""
