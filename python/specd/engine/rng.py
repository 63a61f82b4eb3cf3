"""Philox4x32-10 in torch, vectorized: the same draws as the C++ ``philox_uniform``
(cpp/include/specd/philox.h) for tensors of keys, computed on the keys' device with no host
synchronisation. The draft loop uses it to sample draft tokens inside the loop.

32-bit words are held in int64 tensors; products of two 32-bit words fit in 64 bits (they
wrap in int64 arithmetic, keeping the right bits), and every result is masked to 32 bits.
"""

from __future__ import annotations

import torch

_MASK = 0xFFFFFFFF
_M0, _M1 = 0xD2511F53, 0xCD9E8D57
_W0, _W1 = 0x9E3779B9, 0xBB67AE85


def _mulhilo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    product = b * a  # wraps in int64: the low 64 bits of the exact product
    return (product >> 32) & _MASK, product & _MASK


def philox4x32_10(c0: torch.Tensor, c1: torch.Tensor, c2: torch.Tensor, c3: torch.Tensor,
                  k0: int, k1: int) -> tuple[torch.Tensor, ...]:
    """Counters int64 (broadcastable) holding 32-bit words; key words as ints."""
    for r in range(10):
        if r > 0:
            k0, k1 = (k0 + _W0) & _MASK, (k1 + _W1) & _MASK
        hi0, lo0 = _mulhilo(_M0, c0)
        hi1, lo1 = _mulhilo(_M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


def philox_uniform(seed: int, request: torch.Tensor | int, step: torch.Tensor | int,
                   position: torch.Tensor | int, draw: torch.Tensor | int,
                   device: torch.device | str = "cpu") -> torch.Tensor:
    """float64 uniforms in [0, 1), one per broadcast element of the counter tensors."""
    def word(x):
        return torch.as_tensor(x, dtype=torch.int64, device=device) & _MASK
    c0, c1, c2, c3 = torch.broadcast_tensors(word(request), word(step), word(position), word(draw))
    a, b, _, _ = philox4x32_10(c0, c1, c2, c3, seed & _MASK, (seed >> 32) & _MASK)
    return ((a >> 5).double() * 67108864.0 + (b >> 6).double()) * (1.0 / 9007199254740992.0)
