"""What a step directory is, by format: nbckpt's own layout and Orbax's.

nbckpt's own layout lives in :mod:`nbckpt.formats.layout`; Orbax's in :mod:`nbckpt.formats.orbax`
(what its steps hold, which of them are complete) and :mod:`nbckpt.formats.orbax_write`
(the records nbckpt writes so that Orbax can restore its steps). Nothing here needs jax
or tensorstore: the notebook side, the server and the engine all decide the same way.
This package's ``__init__`` imports nothing, so that :mod:`nbckpt.formats.layout` may use its
modules without an import cycle.
"""
