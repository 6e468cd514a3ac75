"""Old import path of :mod:`seqpack.loader.prefetch`."""

from seqpack._compat import alias_module

alias_module(__name__, "seqpack.loader.prefetch")
