"""Old import path of :mod:`seqpack.schedulers.balanced.locality`."""

from seqpack._compat import alias_module

alias_module(__name__, "seqpack.schedulers.balanced.locality")
