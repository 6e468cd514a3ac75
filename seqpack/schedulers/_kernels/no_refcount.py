"""The decorator of the kernels' hot loops: numba's ``njit`` without reference counting.

numba counts references to every array a function binds (an atomic add on each binding and
each release). A kernel whose helpers unpack arrays from state tuples, inlined into a loop
run once per sequence, pays that on every pass of the loop: in ``home_swaps`` it was about
half of the kernel's time (perf, 16,384 sequences into 256 replicas), in
``repair_replicas`` about a fifth. A loop that allocates nothing needs no counts, so the
loops (:func:`.home._turn`, :func:`.home_book._cache_fill`, :func:`.repair._repair_loop`)
are compiled with numba's ``_nrt=False`` and their callers make every array they use. An allocation inside such a
loop fails at compile time ("NRT required but not enabled"), never silently.
"""

from __future__ import annotations

from seqpack.schedulers._kernels.jit import njit

# ``_nrt`` is numba's option for it (not in numba's type stubs).
no_refcount = njit(cache=True, _nrt=False)  # type: ignore[call-overload]
