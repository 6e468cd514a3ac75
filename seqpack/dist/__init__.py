"""Old import path of :mod:`seqpack.collective` (a folder named ``dist`` is skipped by
linters' default excludes, so the collectives moved). Its modules are shims too."""

from seqpack._compat import warn_moved

warn_moved(__name__, "seqpack.collective", stacklevel=2)

from seqpack.collective import *  # noqa: E402, F403
from seqpack.collective import __all__  # noqa: E402, F401
