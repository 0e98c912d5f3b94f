"""Stateless seeded draws, many at once: numpy's `default_rng(key).random()` for arrays of keys.

The random injectors draw each (worker, iteration) independently from a generator seeded by the
key [seed, worker, iteration] (so a schedule is replayable and a skipped iteration shifts
nothing). One such generator costs about 13 us to build, which was a third of `bench sim`'s time
at 1024 workers and more than its whole budget at 16,384. `first_uniform` computes the same
first double for a whole array of keys with numpy's integer arithmetic, bit for bit:
SeedSequence's entropy pool (numpy/random/bit_generator.pyx), PCG64 seeded from its 4 words
(`pcg64_set_seed`: state high/low, increment high/low), one XSL-RR step, and `next_double`
((x >> 11) * 2**-53). tests/unit/test_draws.py holds it equal to numpy on random keys.

Keys are up to 4 words (SeedSequence's pool), each in 0 .. 2**32 - 1 (one uint32 word each);
anything else goes to numpy's own generator.
"""

from __future__ import annotations

import numpy as np

_M32 = np.uint64(0xFFFFFFFF)
_INIT_A, _MULT_A = 0x43B0D7E5, 0x931E8875
_INIT_B, _MULT_B = 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R = np.uint64(0xCA01F9DD), np.uint64(0x4973F715)
_PCG_HI, _PCG_LO = np.uint64(0x2360ED051FC65DA4), np.uint64(0x4385DF649FCCF645)
_POOL = 4
_U1, _U11, _U16, _U32, _U58, _U63, _U64 = (np.uint64(v) for v in (1, 11, 16, 32, 58, 63, 64))


class _HashMix:
    """SeedSequence's hashmix with its running constant (a plain int: it never depends on the
    data, only on how many values were hashed before)."""

    def __init__(self, init: int, mult: int):
        self.const, self.mult = init, mult

    def __call__(self, value: np.ndarray) -> np.ndarray:
        value = value ^ np.uint64(self.const)
        self.const = self.const * self.mult & 0xFFFFFFFF
        value = (value * np.uint64(self.const)) & _M32
        return value ^ (value >> _U16)


def _mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    result = (_MIX_L * x - _MIX_R * y) & _M32
    return result ^ (result >> _U16)


def _mulhi(a: np.ndarray, b) -> np.ndarray:
    """High 64 bits of the 128-bit product of two uint64 arrays."""
    a0, a1 = a & _M32, a >> _U32
    b0, b1 = b & _M32, b >> _U32
    p00, p01, p10, p11 = a0 * b0, a0 * b1, a1 * b0, a1 * b1
    mid = (p00 >> _U32) + (p01 & _M32) + (p10 & _M32)
    return p11 + (p01 >> _U32) + (p10 >> _U32) + (mid >> _U32)


def _pcg_step(hi, lo, inc_hi, inc_lo):
    """state = state * multiplier + increment (mod 2**128), as (high, low) uint64 arrays."""
    hi = _mulhi(lo, _PCG_LO) + lo * _PCG_HI + hi * _PCG_LO
    lo = lo * _PCG_LO
    return _add128(hi, lo, inc_hi, inc_lo)


def _add128(hi, lo, b_hi, b_lo):
    total = lo + b_lo
    return hi + b_hi + (total < lo).astype(np.uint64), total


def first_uniform(*keys) -> np.ndarray:
    """`np.random.default_rng([k0, k1, ...]).random()` for every element of the broadcast
    key arrays (1 to 4 keys)."""
    arrays = np.broadcast_arrays(*(np.asarray(k, dtype=np.int64) for k in keys))
    if not 1 <= len(arrays) <= _POOL or any(
            a.size and (a.min() < 0 or a.max() > 0xFFFFFFFF) for a in arrays):
        return _numpy_draws(arrays)
    with np.errstate(over="ignore"):
        entropy = [a.astype(np.uint64) for a in arrays]
        hashmix = _HashMix(_INIT_A, _MULT_A)
        zero = np.zeros(arrays[0].shape, dtype=np.uint64)
        pool = [hashmix(entropy[i] if i < len(entropy) else zero) for i in range(_POOL)]
        for src in range(_POOL):
            for dst in range(_POOL):
                if src != dst:
                    pool[dst] = _mix(pool[dst], hashmix(pool[src]))
        # generate_state(4, np.uint64): 8 uint32 words, read as 4 little-endian uint64.
        hashmix = _HashMix(_INIT_B, _MULT_B)
        words = [hashmix(pool[i % _POOL]) for i in range(2 * _POOL)]
        seed_hi, seed_lo, seq_hi, seq_lo = (words[2 * j] | (words[2 * j + 1] << _U32)
                                            for j in range(_POOL))
        inc_hi, inc_lo = (seq_hi << _U1) | (seq_lo >> _U63), (seq_lo << _U1) | _U1
        hi, lo = _pcg_step(zero, zero, inc_hi, inc_lo)
        hi, lo = _add128(hi, lo, seed_hi, seed_lo)
        hi, lo = _pcg_step(hi, lo, inc_hi, inc_lo)
        hi, lo = _pcg_step(hi, lo, inc_hi, inc_lo)  # next64: step, then XSL-RR output
        folded, rotation = hi ^ lo, hi >> _U58
        out = (folded >> rotation) | (folded << ((_U64 - rotation) & _U63))
        return (out >> _U11).astype(np.float64) * (1.0 / 9007199254740992.0)


def _numpy_draws(arrays: list[np.ndarray]) -> np.ndarray:
    flat = [a.ravel().tolist() for a in arrays]
    draws = [np.random.default_rng(list(key)).random() for key in zip(*flat, strict=True)]
    return np.array(draws, dtype=np.float64).reshape(arrays[0].shape)


class SlowBlocks:
    """Which (row, column) of a grid are slowed: first_uniform([seed, row, column, *salt]) <
    probability, computed for all rows and BLOCK columns at a time on first use and kept
    (one byte per cell: a 16,384-worker x 200-iteration run keeps 3.3 MB)."""

    BLOCK = 64

    def __init__(self, seed: int, rows: int, probability: float, salt: tuple[int, ...] = ()):
        self.seed, self.rows, self.probability, self.salt = seed, rows, probability, salt
        self._blocks: dict[int, np.ndarray] = {}

    def __call__(self, row: int, column: int) -> bool:
        return bool(self._block(column)[row, column % self.BLOCK])

    def column(self, column: int) -> np.ndarray:
        """Every row's cell of one column (bool, one per row)."""
        return self._block(column)[:, column % self.BLOCK]

    def _block(self, column: int) -> np.ndarray:
        """The block of BLOCK columns that holds `column`, computed on first use."""
        block = column // self.BLOCK
        slowed = self._blocks.get(block)
        if slowed is None:
            columns = np.arange(block * self.BLOCK, (block + 1) * self.BLOCK)
            draws = first_uniform(self.seed, np.arange(self.rows)[:, None], columns[None, :],
                                  *self.salt)
            slowed = self._blocks[block] = draws < self.probability
        return slowed
