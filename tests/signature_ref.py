"""An independent implementation of the README's "Fingerprint and sketch",
in NumPy, straight from the definition: the tests hold the plugin's numbers
(C++ kernels, AVX2 or not, CPU or device path) to it."""

import numpy as np
import torch

BLOCK_SEED, LANE_SEED, GOLDEN = 0x243F6A88, 0x85A308D3, 0x9E3779B1
SIGN_SEED, PROJ_SEED = 0x13198A2E, 0x03707344

CANON = {
    torch.float32: (np.uint32, 0x7FC00000),
    torch.float64: (np.uint64, 0x7FF8000000000000),
    torch.float16: (np.uint16, 0x7E00),
    torch.bfloat16: (np.uint16, 0x7FC0),
}


def fmix32(h):
    h = h.astype(np.uint32)
    h ^= h >> np.uint32(16)
    h *= np.uint32(0x85EBCA6B)
    h ^= h >> np.uint32(13)
    h *= np.uint32(0xC2B2AE35)
    h ^= h >> np.uint32(16)
    return h


def words(t):
    """The tensor's values as 32-bit words in logical order, NaNs canonical."""
    t = t.detach().cpu().contiguous().resolve_conj().resolve_neg()
    if t.is_complex():
        t = torch.view_as_real(t).contiguous()
    nan = torch.isnan(t) if t.is_floating_point() and t.dtype in CANON else None
    size = t.element_size()
    raw = t.reshape(-1).view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size])
    raw = raw.numpy().view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[size]).copy()
    if nan is not None:
        raw[nan.reshape(-1).numpy()] = CANON[t.dtype][1]
    if size == 8:
        return np.stack([raw & np.uint64(0xFFFFFFFF), raw >> np.uint64(32)], 1).reshape(-1).astype(np.uint32)
    return raw.astype(np.uint32)


def keys(n):
    """The keys of words 0 .. n-1: (B[w // 64] XOR L[w % 64]) OR 1."""
    w = np.arange(n, dtype=np.uint64)
    block = ((w >> np.uint64(6)) & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    lane = (w & np.uint64(63)).astype(np.uint32)
    b = fmix32(block * np.uint32(GOLDEN) + np.uint32(BLOCK_SEED))
    m = fmix32(lane * np.uint32(GOLDEN) + np.uint32(LANE_SEED))
    return (b ^ m) | np.uint32(1)


def fingerprint(t):
    u = words(t).astype(np.uint64)
    # Products below 2^64 each; the uint64 sum wraps, which is the modulus.
    return int((u * keys(u.size).astype(np.uint64)).sum(dtype=np.uint64))


def values(t):
    """The elements as float64 in logical order: complex by magnitude,
    NaN and infinities as 0."""
    t = t.detach().cpu()
    x = (t.to(torch.complex128).abs() if t.is_complex() else t.to(torch.float64)).reshape(-1).numpy().copy()
    x[~np.isfinite(x)] = 0.0
    return x


def sketch(t, k=16):
    """Straight from the definition: s_ij for every element and projection."""
    x = values(t)
    n = x.size
    i = np.arange(n, dtype=np.uint64)
    lg = k.bit_length() - 1
    g = (i >> np.uint64(lg)).astype(np.uint32) * np.uint32(GOLDEN)
    r = (i & np.uint64(k - 1)).astype(np.uint32)
    a = fmix32(g + np.uint32(SIGN_SEED))
    c = fmix32(g + np.uint32(PROJ_SEED)) & np.uint32(k - 1)
    gamma = (a >> r) & np.uint32(1)
    out = np.zeros(k)
    for j in range(k):
        bits = (r ^ c) & np.uint32(j)
        par = (gamma + np.array([bin(b).count("1") for b in range(k)], dtype=np.uint32)[bits]) & np.uint32(1)
        out[j] = np.sum(np.where(par == 1, -x, x))
    return out


def estimate(sa, sb):
    """The sketch's estimate of ||a - b||."""
    sa, sb = np.asarray(sa, dtype=np.float64), np.asarray(sb, dtype=np.float64)
    return float(np.linalg.norm(sa - sb) / np.sqrt(sa.size))
