"""qhead.stats: the statistics of a quantized head against the dense head on the same states.

Everything here is plain torch on tensors the caller gives, so that it is checked on
constructed inputs with known answers (python/tests/test_stats.py). The harness
(``qhead.agree``) feeds it the logits of real decode states.

Per state, for the dense logits ``d`` and the quantized logits ``q`` of one state:

* top-1 agreement: ``argmax q == argmax d`` (the lower id among equal values); after rescoring,
  the best of the K candidates by exact logit against ``argmax d``;
* a **tie**: the dense top-1/top-2 margin is within the rounding noise of the dense logits
  (:func:`logit_error_bound`), so that which of the two is "the" dense top token is decided by
  summation order, not by the model. Ties are counted apart; a flip outside a tie is a real one;
* top-n overlap: ``|top_n(q) ∩ top_n(d)| / n``;
* ``KL(P_d || P_q) = sum_v p_d(v) (log p_d(v) - log p_q(v))`` from the full distributions, in
  float64 (the logits as given, the log-sum-exp of every row);
* Δp of the dense top token, ``p_q(t) - p_d(t)`` with ``t = argmax d``, and Δp of the text's next
  token (llama.cpp's ``llama-perplexity --kl-divergence`` Δp, whose "same top p" is the top-1
  agreement here);
* the negative log-likelihood of the next token, for perplexity.

**Exact top-K rescoring** replaces the K largest quantized logits of a row by their exact
values (``q'``, what ``QuantLMHead(rescore=K)`` returns). It changes K entries only, so its
statistics come from small per-row vectors plus the full-row sums computed once
(:func:`compare_logits`): the log-sum-exp of ``q'`` is ``m + log(S - sum_K e^(q-m) + sum_K
e^(x-m))`` and ``sum_v p_d q'`` changes by ``sum_K p_d (x - q)``, all in float64 (the subtraction
loses at most 1e-16 of the row's mass, far below any KL reported).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

__all__ = ["Z95", "wilson", "unit_roundoff", "gamma", "logit_error_bound", "is_tie", "DenseRows", "compare_logits", "summarize",
           "quantile", "PerState"]

# The 97.5% point of the standard normal: a two-sided 95% interval.
Z95 = 1.959963984540054


def wilson(k: int, n: int, z: float = Z95) -> Tuple[float, float]:
    """The Wilson score interval of a binomial proportion k/n (the 95% interval by default).
    n = 0 gives (0, 1)."""
    if n <= 0:
        return 0.0, 1.0
    if not 0 <= k <= n:
        raise ValueError(f"wilson: k = {k} must be in [0, n = {n}]")
    p = k / n
    z2 = z * z
    den = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / den
    half = z * math.sqrt(p * (1.0 - p) / n + z2 / (4.0 * n * n)) / den
    return max(0.0, centre - half), min(1.0, centre + half)


_ROUNDOFF = {torch.float64: 2.0 ** -53, torch.float32: 2.0 ** -24, torch.float16: 2.0 ** -11,
             torch.bfloat16: 2.0 ** -8}


def unit_roundoff(dtype: torch.dtype) -> float:
    """u of a floating-point dtype (half an ulp at 1): 2^-24 for f32, 2^-8 for bf16, 2^-11 for f16."""
    if dtype not in _ROUNDOFF:
        raise ValueError(f"unit_roundoff: not a float dtype: {dtype}")
    return _ROUNDOFF[dtype]


def gamma(n: int, u: float) -> float:
    """gamma_n = n u / (1 - n u): the relative error bound of a sum of n terms in a float arithmetic
    with unit roundoff u, in any summation order (Higham, Accuracy and Stability, Lemma 3.1)."""
    if n * u >= 1.0:
        raise ValueError(f"gamma: n u = {n * u} >= 1 (no bound)")
    return n * u / (1.0 - n * u)


def logit_error_bound(abs_dot: Tensor, logit: Tensor, hidden: int, out_dtype: torch.dtype = torch.float32,
                      acc_dtype: torch.dtype = torch.float32) -> Tensor:
    """The rounding noise of a dense logit l = sum_h x_h w_h computed by the model: the dot product
    accumulated in ``acc_dtype`` over ``hidden`` products (error <= gamma_H * sum_h |x_h w_h|,
    ``abs_dot``), then rounded to ``out_dtype`` when that is coarser (error <= u_out |l|). x and w
    are taken as exact (they are the model's stored values). Elementwise over the tensors given."""
    e = gamma(hidden, unit_roundoff(acc_dtype)) * abs_dot.double()
    if unit_roundoff(out_dtype) > unit_roundoff(acc_dtype):
        e = e + unit_roundoff(out_dtype) * logit.double().abs()
    return e


def is_tie(top1: Tensor, top2: Tensor, e1: Tensor, e2: Tensor) -> Tensor:
    """True where the dense top-1/top-2 margin is within the two logits' rounding noise
    (top1 - top2 <= e1 + e2): either could be the model's top token."""
    return (top1.double() - top2.double()) <= (e1.double() + e2.double())


@dataclass
class PerState:
    """Per-state results of one (scheme, K) over a chunk of states (1-D tensors of length B)."""
    agree: Tensor        # bool: top1 == argmax d
    top1: Tensor         # int64: argmax q (K = 0); the best of the K candidates by exact logit (K > 0)
    displaced: Tensor    # bool: argmax q' is not top1 (K > 0: no candidate's exact logit reaches it)
    overlap: Dict[int, Tensor]  # n -> float64 |top_n(q') ∩ top_n(d)| / n
    kl: Tensor           # float64 KL(P_d || P_q')
    dp_top: Tensor       # float64 p_q'(t) - p_d(t), t = argmax d
    dp_target: Optional[Tensor]  # float64 p_q'(y) - p_d(y), y = the next token (None without targets)
    nll: Optional[Tensor]        # float64 -log p_q'(y)


def _rank_sort(values: Tensor, ids: Tensor) -> Tuple[Tensor, Tensor]:
    """values [B, C] and ids [B, C] sorted by value descending, ties: lower id first."""
    # Two stable sorts: by id, then by value (descending); equal values keep the id order.
    o = torch.argsort(ids, dim=1, stable=True)
    v, i = values.gather(1, o), ids.gather(1, o)
    o = torch.argsort(v, dim=1, descending=True, stable=True)
    return v.gather(1, o), i.gather(1, o)


def _rowdot(a: Tensor, b: Tensor) -> Tensor:
    """sum_v a[i, v] b[i, v] per row, float64 out. A long f32 dot product can lose up to V u of its
    magnitude, the size of an 8-bit head's KL; so the rows are cut into blocks of at most 1024
    (batched f32 dot products, no [B, V] temporary) whose sums are added in float64."""
    rows, v = a.shape
    blk = next((n for n in (1024, 512, 256, 128, 64) if v % n == 0), None)
    if blk is None:
        return (a * b).sum(dim=1, dtype=torch.float64)
    parts = torch.bmm(a.reshape(-1, 1, blk), b.reshape(-1, blk, 1)).reshape(rows, v // blk)
    return parts.sum(dim=1, dtype=torch.float64)


def _overlap(a: Tensor, b: Tensor) -> Tensor:
    """|a_row ∩ b_row| / n for id lists a, b [B, n] (ids unique within a row)."""
    return (a.unsqueeze(2) == b.unsqueeze(1)).any(dim=2).sum(dim=1).double() / a.shape[1]


@dataclass
class DenseRows:
    """The dense side of a chunk of states, computed once and shared by every quantized table:
    the logits ``d`` [B, V] f32, ``p`` = softmax(d) f32, the top-1 id, the top-n id lists, the
    NLL of the targets (float64) and p of the top token and of the targets."""
    d: Tensor
    p: Tensor
    top1: Tensor
    topn: Dict[int, Tensor]
    targets: Optional[Tensor]
    nll: Optional[Tensor]
    p_top: Tensor
    p_target: Optional[Tensor]
    psum: Tensor  # sum_v p (1 up to the f32 rounding of the softmax; every use divides by it)

    @staticmethod
    def of(dense: Tensor, targets: Optional[Tensor] = None, topn: Sequence[int] = (5, 10)) -> "DenseRows":
        if dense.dim() != 2:
            raise ValueError(f"DenseRows: dense logits must be [B, V], got {tuple(dense.shape)}")
        b, v = dense.shape
        if topn and max(topn) > v:
            raise ValueError(f"DenseRows: top-n {list(topn)} > V = {v}")
        d = dense.float().contiguous()
        p = torch.softmax(d, dim=1)
        rows = torch.arange(b)
        nmax = max(topn) if topn else 1
        _, ti = _rank_sort(*torch.topk(d, nmax, dim=1))
        top1 = ti[:, 0]
        tn = {n: ti[:, :n] for n in topn}
        nll = p_t = None
        if targets is not None:
            t = targets.long()
            if t.shape != (b,):
                raise ValueError(f"DenseRows: targets must be [{b}], got {tuple(t.shape)}")
            # The dense NLL itself needs no more than f32; the quantized one is formed from it and
            # the differences (see compare_logits), so that Δppl does not depend on its rounding.
            nll = (torch.logsumexp(d, dim=1) - d[rows, t]).double()
            p_t = p[rows, t].double()
            targets = t
        psum = p.sum(dim=1, dtype=torch.float64)
        return DenseRows(d, p, top1, tn, targets, nll, p[rows, top1].double() / psum,
                         p_t / psum if p_t is not None else None, psum)


def compare_logits(dense, quant: Tensor, ks: Sequence[int], exact: Optional[Callable[[Tensor], Tensor]] = None,
                   targets: Optional[Tensor] = None, topn: Sequence[int] = (5, 10)) -> Dict[int, PerState]:
    """Per-state statistics of the quantized logits ``quant`` [B, V] against the dense logits
    (``dense``: a [B, V] tensor, or the :class:`DenseRows` of one, which then carries the targets
    and top-n), for each K in ``ks`` (0: the quantized logits as they are; K > 0: their K largest
    entries replaced by exact values). ``exact(ids [B, C]) -> values [B, C]`` gives the exact
    logits of candidate ids (needed when some K > 0); ``targets`` [B] the next token of each state.
    Returns {K: PerState}.

    With delta = q - d - c (c: q - d at the dense top token, so that a constant shift cancels), the
    figures are formed without cancellation: KL(P_d || P_q) = -sum p delta + log1p(A),
    p_q(t) = p_d(t) exp(delta_t - log1p(A)), nll_q(y) = nll_d(y) - delta_y + log1p(A), where
    A = sum p expm1(delta), p normalized by its f32 sum. Rescoring K entries changes those sums by
    K terms (float64)."""
    dr = dense if isinstance(dense, DenseRows) else DenseRows.of(dense, targets, topn)
    d, p = dr.d, dr.p
    if d.shape != quant.shape:
        raise ValueError(f"compare_logits: dense {tuple(d.shape)} and quant {tuple(quant.shape)} must be the same "
                         f"[B, V]")
    b, v = d.shape
    kmax = max([k for k in ks] + [0])
    if kmax > v or min(ks, default=0) < 0:
        raise ValueError(f"compare_logits: K values {list(ks)} must be in [0, V = {v}]")
    if kmax and exact is None:
        raise ValueError("compare_logits: K > 0 needs exact")
    ns = sorted(dr.topn)
    nmax = max(ns) if ns else 0
    rows = torch.arange(b)
    q = quant.float()

    # Full rows, once per table. delta is taken relative to its value at the dense top token, so
    # that a constant shift of the logits (which changes no probability) cancels exactly.
    delta = q - d
    shift = delta[rows, dr.top1].clone()
    delta -= shift[:, None]
    c = max(1, min(v, kmax + nmax))
    qv, qi = _rank_sort(*torch.topk(q, c, dim=1))
    dl_top = delta[rows, dr.top1].double()
    dl_tgt = delta[rows, dr.targets].double() if dr.targets is not None else None
    dl_k = delta.gather(1, qi[:, :kmax]) if kmax else None
    s_pd = _rowdot(p, delta)  # sum p delta
    torch.expm1(delta, out=delta)
    a = _rowdot(p, delta)     # sum p expm1(delta) = Z_q / Z_d - 1 (with p's sum)
    em_k = delta.gather(1, qi[:, :kmax]) if kmax else None
    del delta
    xv = exact(qi[:, :kmax]).double() if kmax else None

    out: Dict[int, PerState] = {}
    for k in ks:
        if k == 0:
            s, aa, vals, ids = s_pd, a, qv, qi
            t_top, t_tgt = dl_top, dl_tgt
        else:
            ik = qi[:, :k]
            e = xv[:, :k]
            pk, dk = p.gather(1, ik).double(), d.gather(1, ik).double() + shift.double()[:, None]
            # Take out the K terms exactly as the full sums took them in (the f32 delta), put in
            # the exact ones (float64).
            s = s_pd + (pk * (e - dk)).sum(dim=1) - (pk * dl_k[:, :k].double()).sum(dim=1)
            aa = a + (pk * torch.expm1(e - dk)).sum(dim=1) - (pk * em_k[:, :k].double()).sum(dim=1)
            vals, ids = _rank_sort(torch.cat([e.to(qv.dtype), qv[:, k:]], dim=1), qi)
            hit = ik == dr.top1[:, None]
            t_top = torch.where(hit.any(dim=1), ((e - dk) * hit).sum(dim=1), dl_top)
            if dr.targets is not None:
                hit_t = ik == dr.targets[:, None]
                t_tgt = torch.where(hit_t.any(dim=1), ((e - dk) * hit_t).sum(dim=1), dl_tgt)
        l1p = torch.log1p(aa / dr.psum)
        kl = (l1p - s / dr.psum).clamp_min(0.0)
        if k == 0:
            top1 = ids[:, 0].long()
            displaced = torch.zeros(b, dtype=torch.bool)
        else:
            # The rescored top-1 is the best candidate by its exact logit (what the rescore op and
            # QuantLMHead.topk return): agreement can only grow with K. The argmax of q' itself
            # leaves the candidates when every exact candidate falls below the best quantized
            # non-candidate: counted as displaced.
            top1 = _rank_sort(e, ik)[1][:, 0].long()
            displaced = ids[:, 0].long() != top1
        out[k] = PerState(
            agree=top1 == dr.top1, top1=top1, displaced=displaced,
            overlap={n: _overlap(ids[:, :n], dr.topn[n]) for n in ns},
            kl=kl, dp_top=dr.p_top * torch.expm1(t_top - l1p),
            dp_target=dr.p_target * torch.expm1(t_tgt - l1p) if dr.targets is not None else None,
            nll=dr.nll - t_tgt + l1p if dr.targets is not None else None)
    return out


def quantile(x: Tensor, q: float) -> float:
    """The q-quantile of a 1-D tensor (linear interpolation; NaN for an empty one)."""
    if x.numel() == 0:
        return float("nan")
    return float(torch.quantile(x.double(), q)) if x.numel() < (1 << 24) else float(
        x.double().sort().values[min(x.numel() - 1, int(round(q * (x.numel() - 1))))])


def summarize(agree: Tensor, tie: Tensor, kl: Tensor, overlap: Dict[int, Tensor], dp_top: Tensor,
              dp_target: Optional[Tensor] = None, nll: Optional[Tensor] = None,
              nll_dense: Optional[Tensor] = None) -> Dict[str, float]:
    """One record's figures from per-state tensors over all its states: agreement with its Wilson
    95% interval, ties, flips (all and outside ties, and per 1000 states), top-n overlap, KL mean /
    median / p99 / p99.9 / max, "same top p" (%), Δp (mean and RMS, of the dense top token and of
    the next token), and perplexity (dense, quantized, Δ%) when nll tensors are given."""
    n = int(agree.numel())
    k = int(agree.sum())
    ties = int(tie.sum())
    flips = n - k
    flips_out = int((~agree & ~tie).sum())
    lo, hi = wilson(k, n)
    r: Dict[str, float] = {
        "states": n, "ties": ties, "top1_agreement": k / n if n else float("nan"), "wilson_lo": lo,
        "wilson_hi": hi, "flips": flips, "flips_outside_ties": flips_out,
        "flips_per_1k": 1000.0 * flips / n if n else float("nan"),
        "flips_outside_ties_per_1k": 1000.0 * flips_out / n if n else float("nan"),
        "same_top_p_pct": 100.0 * k / n if n else float("nan"),
    }
    for m_, t in sorted(overlap.items()):
        r[f"top{m_}_overlap"] = float(t.mean())
    kl = kl.double()
    r.update(kl_mean=float(kl.mean()), kl_median=quantile(kl, 0.5), kl_p99=quantile(kl, 0.99),
             kl_p999=quantile(kl, 0.999), kl_max=float(kl.max()) if n else float("nan"))
    r.update(dp_top_mean_pct=100.0 * float(dp_top.mean()), dp_top_rms_pct=100.0 * float(dp_top.pow(2).mean().sqrt()))
    if dp_target is not None and dp_target.numel():
        r.update(dp_target_mean_pct=100.0 * float(dp_target.mean()),
                 dp_target_rms_pct=100.0 * float(dp_target.pow(2).mean().sqrt()))
    if nll is not None and nll_dense is not None and nll.numel():
        ppl, ppl_d = math.exp(float(nll.mean())), math.exp(float(nll_dense.mean()))
        r.update(ppl_states=int(nll.numel()), ppl_dense=ppl_d, ppl=ppl, dppl_pct=100.0 * (ppl / ppl_d - 1.0))
    return r
