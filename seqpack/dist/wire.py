"""Old import path of :mod:`seqpack.collective.wire`."""

from seqpack._compat import alias_module

alias_module(__name__, "seqpack.collective.wire")
