"""Old import path of :mod:`seqpack.schedulers.balanced.exact`."""

from seqpack._compat import alias_module

alias_module(__name__, "seqpack.schedulers.balanced.exact")
