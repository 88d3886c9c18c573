"""Float64 oracles and error bounds for the qhead.torch tests.

The oracle dequantizes a QuantTable's compressed-tensors tensors itself (bit
arithmetic on the int32 words, independent of qhead) and computes logits in
float64. Error bounds, as tests/test_ops.cc derives them: a logit is a length-H
dot product accumulated in f32, so for any summation order

    |computed - exact| <= (γ_H(2^-24) + γ_{H+4}(2^-53)) · Σ_j |x_j w_j|,  γ_n(u) = n·u / (1 - n·u)

(Higham §3.1; x_j as converted to f32, which f16/bf16 widen exactly; w_j the
dequantized weights, exact in f32). On CUDA the fused kernels may truncate in
the tensor cores (u = 2^-23 over H + groups + 1 additions) and the cuBLAS
fallback rounds each weight to the activation dtype (u_T more), as
tests/test_cuda.cc derives.
"""

from __future__ import annotations

import math

import pytest
import torch

U32 = 2.0 ** -24
U64 = 2.0 ** -53
_UNIT = {torch.float32: U32, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}


def gamma(n: int, u: float) -> float:
    return n * u / (1 - n * u)


def unpack_codes(words: torch.Tensor, n: int, bits: int, dim: int) -> torch.Tensor:
    """Unsigned codes along `dim` of int32 words (bits in {2, 4, 8}: no code straddles words)."""
    assert 32 % bits == 0
    w = words.to(torch.int64) & 0xFFFFFFFF
    per = 32 // bits
    shifts = torch.arange(per, dtype=torch.int64) * bits
    if dim == 1:
        c = (w.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)  # [R, words, per]
        return c.reshape(w.shape[0], -1)[:, :n]
    c = (w.unsqueeze(1) >> shifts.view(1, per, 1)) & ((1 << bits) - 1)  # [words, per, G]
    return c.reshape(-1, w.shape[1])[:n]


def parse_scheme(name: str):
    """(bits, group_size or -1, symmetric) of a scheme name like w4g64a."""
    s = name[1:]
    sym = not s.endswith("a")
    s = s.rstrip("a")
    if "g" in s:
        b, g = s.split("g")
        return int(b), int(g), sym
    return int(s), -1, sym


def dequantize(qt) -> torch.Tensor:
    """float64 [V, H] in hidden order, from the QuantTable's buffers."""
    bits, gs, sym = parse_scheme(qt.scheme)
    V, H = qt.vocab, qt.hidden
    wp = qt.weight_packed.cpu()
    q = unpack_codes(wp, H, bits, 1) - (1 << (bits - 1))
    s = qt.weight_scale.cpu().to(torch.float64)
    glen = H if gs < 0 else gs
    gidx = torch.arange(H) // glen
    z = torch.zeros_like(s)
    if not sym:
        z = (unpack_codes(qt.weight_zero_point.cpu(), V, bits, 0) - (1 << (bits - 1))).to(torch.float64)
    w = (q.to(torch.float64) - z[:, gidx]) * s[:, gidx]
    if qt.col_perm is not None:
        out = torch.empty_like(w)
        out[:, qt.col_perm.cpu().long()] = w
        w = out
    return w


def oracle_logits(w: torch.Tensor, x: torch.Tensor):
    """(float64 logits [M, V], per-entry f32 bound [M, V]) of x [M, H] against w [V, H] (float64)."""
    xd = x.detach().cpu().to(torch.float32).to(torch.float64)
    val = xd @ w.T
    abs_sum = xd.abs() @ w.abs().T
    H = w.shape[1]
    return val, (gamma(H, U32) + gamma(H + 4, U64)) * abs_sum + 1e-30


def cuda_bound(w: torch.Tensor, x: torch.Tensor, groups: int):
    """The CUDA bound of test_cuda.cc (fused kernel or cuBLAS fallback, whichever runs)."""
    xd = x.detach().cpu().to(torch.float32).to(torch.float64)
    H = w.shape[1]
    abs_sum = xd.abs() @ w.abs().T
    return xd @ w.T, (gamma(H + groups + 1, 2 * U32) + _UNIT[x.dtype] + gamma(H + 4, U64)) * abs_sum + 1e-30


def lse_tol(n: int, lse: float, max_tau: float, cuda: bool = False) -> float:
    """Tolerance of a computed log-sum-exp: test_ops.cc lse_tol (the fused CPU form, which also
    covers the reference's), or on CUDA test_cuda.cc's (γ_{V/8+64} + 2^-21 relative), whichever
    is larger."""
    e = 2.0 ** -22 + 88 * U32
    delta = e + gamma(n, U32) * (1 + e)
    ev = -math.log1p(-delta) + 2 * (4.0 * (n + 2) * U64)
    tol = max_tau + ev + (abs(lse) + max_tau) * U32
    if cuda:
        tol = max(tol, max_tau + (gamma(n // 8 + 64, U32) + 2.0 ** -21) * max(1.0, abs(lse)))
    return tol


def assert_close_bound(got: torch.Tensor, want: torch.Tensor, tol: torch.Tensor, what: str):
    g = got.detach().cpu().to(torch.float64)
    assert g.shape == want.shape, f"{what}: shape {tuple(g.shape)} != {tuple(want.shape)}"
    assert not torch.isnan(g).any(), f"{what}: NaN (unwritten) entries"
    err = (g - want).abs()
    bad = err > tol
    if bad.any():
        i = bad.nonzero()[0].tolist()
        pytest.fail(f"{what}: {int(bad.sum())} entries outside the bound; first at {i}: got {g[tuple(i)].item()} "
                    f"want {want[tuple(i)].item()} err {err[tuple(i)].item()} > {tol[tuple(i)].item()}")


def check_topk(values, ids, lse, want, tol, k: int, what: str):
    """values/ids/lse of a top-k against the oracle logits `want` [M, V] and bounds `tol`."""
    v = values.detach().cpu().to(torch.float64)
    i = ids.detach().cpu().to(torch.int64)
    M, V = want.shape
    assert v.shape == (M, k) and i.shape == (M, k), what
    assert not torch.isnan(v).any(), f"{what}: NaN (unwritten) values"
    assert ((i >= 0) & (i < V)).all(), f"{what}: ids out of range (unwritten?)"
    assert (v[:, :-1] >= v[:, 1:]).all(), f"{what}: values not sorted descending"
    for m in range(M):
        assert len(set(i[m].tolist())) == k, f"{what}: duplicate ids in row {m}"
    assert_close_bound(v, want.gather(1, i), tol.gather(1, i), what + " values")
    worst_in = (want.gather(1, i) + tol.gather(1, i)).min(dim=1).values
    mask = torch.ones_like(want, dtype=torch.bool)
    mask.scatter_(1, i, False)
    best_out = torch.where(mask, want - tol, torch.full_like(want, -math.inf)).max(dim=1).values
    assert (best_out <= worst_in).all(), f"{what}: an id left out beats a returned one by more than the bounds"
    if lse is not None:
        cuda = lse.is_cuda
        l = lse.detach().cpu().to(torch.float64)
        want_lse = torch.logsumexp(want, dim=1)
        for m in range(M):
            t = lse_tol(V, want_lse[m].item(), tol[m].max().item(), cuda)
            assert abs(l[m].item() - want_lse[m].item()) <= t, f"{what}: lse row {m}: {l[m]} vs {want_lse[m]} > {t}"


def poison_empty(*size, dtype, device=None, **kw):
    """torch.empty that fills floats with NaN and integers with INT_MIN (unwritten outputs show)."""
    t = torch.empty(*size, dtype=dtype, device=device, **kw)
    if t.is_floating_point():
        t.fill_(float("nan"))
    else:
        t.fill_(torch.iinfo(t.dtype).min)
    return t


def random_weight(v: int, h: int, seed: int, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.rand((v, h), generator=g, dtype=torch.float64) * 2 - 1).to(dtype)


def random_x(shape, seed: int, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 1).to(dtype)
