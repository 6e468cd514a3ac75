"""Old import path of :mod:`seqpack.collective.agree`."""

from seqpack._compat import alias_module

alias_module(__name__, "seqpack.collective.agree")
