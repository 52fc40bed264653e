"""The ``%ckpt_*`` magics: arguments declared once, help, one-line errors.

``%load_ext nbckpt`` registers them. Each magic parses its line and calls the client
(:mod:`nbckpt.session.client`); nothing here talks to the engines directly.
"""

from nbckpt.magics.commands import NbckptMagics, load_ipython_extension

__all__ = ["NbckptMagics", "load_ipython_extension"]
