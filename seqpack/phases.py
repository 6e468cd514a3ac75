"""Old import path of :mod:`seqpack.loader.phases`."""

from seqpack._compat import alias_module

alias_module(__name__, "seqpack.loader.phases")
