"""Counter-based randomness for the plan: splitmix64 of (seed, purpose, coordinates).

Every random choice of a plan (the write-time scatter, each pool's epoch permutations,
the within-step shuffle) sorts by ``mix(base + counter)``, where ``base`` is
:func:`derive` of the seed, a purpose tag and the coordinates (phase, stream, bucket).
The finaliser is a bijection on 64 bits, so keys are unique and a sort has one,
platform-free answer; and a key depends only on its counter, so the output does not
depend on how steps are chunked.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from catalog.errors import InvalidRecipe

__all__ = ["M64", "TAG_EPOCH", "TAG_SCATTER", "TAG_STEP", "check_seed", "derive", "mix"]

M64 = (1 << 64) - 1
#: Purpose tags: one stream of keys per use, so no two uses share a key.
TAG_SCATTER, TAG_EPOCH, TAG_STEP = 0x5C, 0xE9, 0x57


def _mix_int(x: int) -> int:
    """splitmix64 on a Python int (seeds and per-purpose bases)."""
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def derive(*parts: int) -> int:
    """The 64-bit base of one purpose: the parts (seed, tag, coordinates) chained
    through splitmix64."""
    h = 0
    for part in parts:
        h = _mix_int(h ^ (part & M64))
    return h


def mix(x: NDArray[np.uint64]) -> NDArray[np.uint64]:
    """splitmix64's finaliser, in place. A bijection on 64 bits: distinct counters give
    distinct keys, so every argsort over them has no ties and one platform-free answer."""
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


def check_seed(seed: int) -> int:
    """``seed`` as an int, or :class:`InvalidRecipe` unless it lies in ``[0, 2**64)``."""
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or not 0 <= seed <= M64:
        raise InvalidRecipe(f"seed must be an integer in [0, 2**64), got {seed!r}", path="seed")
    return int(seed)
