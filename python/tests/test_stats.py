"""qhead.stats on constructed inputs whose answers are known.

- Wilson intervals against the published values of Newcombe (1998), "Two-sided confidence
  intervals for the single proportion: comparison of seven methods", Statistics in Medicine
  17:857-872, Table I, method 3 (score interval without continuity correction).
- KL divergence against closed forms.
- Tie counting at the rounding bound and one ulp past it.
- Rescoring that fixes a planted flip, and the small-vector rescoring statistics against a
  direct computation on the rescored logits (scatter, then full log-softmax), K = 1 ... V.
"""
import math

import pytest

torch = pytest.importorskip("torch")

from qhead import stats  # noqa: E402


@pytest.mark.parametrize("k,n,lo,hi", [
    (81, 263, 0.2553, 0.3662),
    (15, 148, 0.0624, 0.1605),
    (0, 20, 0.0000, 0.1611),
    (1, 29, 0.0061, 0.1718),
])
def test_wilson_matches_newcombe(k, n, lo, hi):
    a, b = stats.wilson(k, n)
    assert a == pytest.approx(lo, abs=6e-5)
    assert b == pytest.approx(hi, abs=6e-5)


def test_wilson_edges():
    assert stats.wilson(0, 0) == (0.0, 1.0)
    lo, hi = stats.wilson(10, 10)
    assert hi == pytest.approx(1.0, abs=1e-15) and lo == pytest.approx(0.7225, abs=6e-5)  # 10/10
    with pytest.raises(ValueError):
        stats.wilson(11, 10)


def test_gamma_and_roundoff():
    assert stats.unit_roundoff(torch.float32) == 2.0 ** -24
    assert stats.unit_roundoff(torch.bfloat16) == 2.0 ** -8
    assert stats.gamma(1024, 2.0 ** -24) == pytest.approx(1024 * 2.0 ** -24 / (1 - 1024 * 2.0 ** -24), rel=1e-15)
    with pytest.raises(ValueError):
        stats.gamma(1 << 24, 2.0 ** -24)


def _kl_ref(d, q):
    p = torch.softmax(d.double(), 1)
    return (p * (torch.log_softmax(d.double(), 1) - torch.log_softmax(q.double(), 1))).sum(1)


def test_kl_closed_forms():
    # P = (1/2, 1/4, 1/4) against the uniform Q: KL = log 3 - H(P) = log 3 - 1.5 log 2.
    d = torch.tensor([[math.log(0.5), math.log(0.25), math.log(0.25)]], dtype=torch.float32)
    q = torch.zeros(1, 3)
    r = stats.compare_logits(d, q, [0], topn=(1, 2))[0]
    assert float(r.kl[0]) == pytest.approx(math.log(3) - 1.5 * math.log(2), rel=1e-6)
    # Two-point distributions p, q: KL = p log(p/q) + (1-p) log((1-p)/(1-q)); shifts do not matter.
    p_, q_ = 0.9, 0.6
    d = torch.tensor([[0.0, math.log(p_ / (1 - p_))]]) + 7.0
    q = torch.tensor([[0.0, math.log(q_ / (1 - q_))]]) - 3.0
    r = stats.compare_logits(d, q, [0], topn=(1,))[0]
    want = p_ * math.log(p_ / q_) + (1 - p_) * math.log((1 - p_) / (1 - q_))
    assert float(r.kl[0]) == pytest.approx(want, rel=1e-6)
    # Identical logits: KL 0, full agreement, Δp 0.
    g = torch.Generator().manual_seed(3)
    d = torch.randn(5, 50, generator=g)
    r = stats.compare_logits(d, d.clone(), [0])[0]
    assert torch.all(r.kl < 1e-12) and bool(r.agree.all())
    assert float(r.dp_top.abs().max()) < 1e-12
    assert bool((r.overlap[5] == 1).all()) and bool((r.overlap[10] == 1).all())


def test_tie_at_the_bound_and_past_it():
    h = 64
    x = torch.full((1, h), 0.5, dtype=torch.float64)
    w = torch.full((2, h), 0.25, dtype=torch.float64)
    abs_dot = (x.abs() * w.abs()).sum(1)  # 8.0 for both rows
    e = stats.logit_error_bound(abs_dot, abs_dot, h)
    bound = float(e[0] + e[1])
    assert bound == pytest.approx(2 * 8.0 * stats.gamma(h, 2.0 ** -24), rel=1e-15)
    top1 = torch.tensor([10.0 + bound], dtype=torch.float64)
    top2 = torch.tensor([10.0], dtype=torch.float64)
    margin = float(top1 - top2)  # the margin as the comparison computes it
    assert margin <= bound
    assert bool(stats.is_tie(top1, top2, e[:1], e[1:]))
    past = torch.tensor([math.nextafter(10.0 + bound, math.inf)], dtype=torch.float64)
    while float(past - top2) <= bound:
        past = torch.nextafter(past, torch.tensor([math.inf], dtype=torch.float64))
    assert not bool(stats.is_tie(past, top2, e[:1], e[1:]))
    # A model dtype coarser than f32 adds its rounding of the logit.
    e16 = stats.logit_error_bound(abs_dot, torch.tensor([10.0, 10.0]), h, torch.bfloat16)
    assert float(e16[0] - e[0]) == pytest.approx(10.0 * 2.0 ** -8, rel=1e-12)


def test_rescoring_fixes_a_planted_flip():
    g = torch.Generator().manual_seed(7)
    v = 40
    d = torch.randn(1, v, generator=g, dtype=torch.float32)
    true_top = int(d.argmax())
    d[0, true_top] += 1.0
    order = torch.argsort(d[0], descending=True)
    second = int(order[1])
    q = d.clone() + 0.01 * torch.randn(1, v, generator=g)
    q[0, second] = d[0, true_top] + 0.5  # the quantized head ranks the second token first
    exact = lambda ids: d.gather(1, ids)  # noqa: E731
    r = stats.compare_logits(d, q, [0, 1, 2, 8], exact=exact)
    assert not bool(r[0].agree[0])
    assert int(r[0].top1[0]) == second
    # K = 1 rescores only the wrong candidate (down, below the true top's quantized logit: displaced);
    # K = 2 has both candidates and picks the true top by its exact logit.
    assert not bool(r[1].agree[0]) and bool(r[1].displaced[0])
    assert bool(r[2].agree[0]) and bool(r[8].agree[0]) and not bool(r[2].displaced[0])
    assert float(r[8].kl[0]) < float(r[0].kl[0])


def test_displaced_rescoring_keeps_the_best_candidate():
    # Quantized: token 0 first, token 1 second; exact: token 0 drops below token 1's quantized
    # logit. K = 1 rescores token 0 only: the best candidate is 0, but argmax q' is token 1.
    d = torch.tensor([[5.0, 6.0, 0.0, -1.0]])
    q = torch.tensor([[7.0, 5.5, 0.0, -1.0]])
    exact = lambda ids: d.gather(1, ids)  # noqa: E731
    r = stats.compare_logits(d, q, [0, 1, 2], exact=exact, topn=(1, 2))
    assert int(r[1].top1[0]) == 0 and bool(r[1].displaced[0]) and not bool(r[1].agree[0])
    assert int(r[2].top1[0]) == 1 and not bool(r[2].displaced[0]) and bool(r[2].agree[0])
    assert not bool(r[0].displaced[0])


def _rescored_reference(d, q, k, exact):
    """Direct: scatter the exact values of q's top-k into q, then every figure from the full rows."""
    qv, qi = torch.topk(q, k, dim=1)
    qq = q.clone().scatter_(1, qi, exact(qi))
    p = torch.softmax(d.double(), 1)
    logq = torch.log_softmax(qq.double(), 1)
    kl = (p * (torch.log_softmax(d.double(), 1) - logq)).sum(1)
    ex = exact(qi)
    top1 = qi.gather(1, ex.argmax(1, keepdim=True))[:, 0]  # the best candidate (no equal values here)
    t = d.argmax(1)
    rows = torch.arange(d.shape[0])
    dp = logq[rows, t].exp() - p[rows, t]
    return kl, top1, dp, logq


@pytest.mark.parametrize("v", [3, 50, 257])
def test_small_vector_rescoring_equals_the_direct_computation(v):
    g = torch.Generator().manual_seed(v)
    b = 6
    d = 3 * torch.randn(b, v, generator=g)
    q = d + 0.3 * torch.randn(b, v, generator=g)
    exact = lambda ids: d.gather(1, ids)  # noqa: E731
    targets = torch.randint(0, v, (b,), generator=g)
    ks = sorted(set(k for k in (1, 2, 3, 8, 16, v) if k <= v))
    topn = tuple(n for n in (1, 2) if n <= v)
    got = stats.compare_logits(d, q, [0, *ks], exact=exact, targets=targets, topn=topn)
    u = 2.0 ** -24
    rows = torch.arange(b)
    for k in ks:
        kl, top1, dp, logq = _rescored_reference(d, q, k, exact)
        # The f32 arithmetic's error: p = softmax(d) in f32 is off by at most about
        # u (|d - max d| + 4) relative per entry, the differences delta by u |delta|; the sums
        # of p delta and p expm1(delta) inherit those, term by term (float64 accumulation).
        qq = q.clone().scatter_(1, torch.topk(q, k, dim=1).indices, exact(torch.topk(q, k, dim=1).indices))
        p = torch.softmax(d.double(), 1)
        rel = u * ((d.double() - d.double().max(1, keepdim=True).values).abs() + 4)
        tol = torch.full((b,), 1e-12, dtype=torch.float64)
        for qx in (q, qq):  # the full-row sums take the quantized rows in, the rescoring corrects K terms
            dl = (qx - d).double()
            dl = dl - dl[rows, d.argmax(1)][:, None]
            tol += 4 * (p * (rel + u) * (dl.abs() + torch.expm1(dl).abs())).sum(1)
        assert bool(((got[k].kl - kl.clamp_min(0)).abs() <= tol).all()), (k, (got[k].kl - kl).abs().max(), tol.min())
        assert torch.equal(got[k].top1, top1), k
        t = d.argmax(1)
        tol_p = p[rows, t] * (rel[rows, t] + 2 * u) * 4 + tol
        assert bool(((got[k].dp_top - dp).abs() <= tol_p).all()), k
        tol_n = tol + 4 * u * (1 + dl.abs().max(1).values)
        assert bool(((got[k].nll + logq[rows, targets]).abs() <= tol_n).all()), k
    # Agreement never falls as K grows (the candidates of K are among those of K + 1).
    for k0, k1 in zip([0, *ks], ks):
        assert bool((got[k1].agree | ~got[k0].agree).all()), (k0, k1)
    # K = V rescoring is the dense head itself.
    assert bool(got[v].agree.all()) and float(got[v].kl.max()) < 1e-6


def test_summarize_counts():
    agree = torch.tensor([True, True, False, False, True])
    tie = torch.tensor([False, False, True, False, False])
    kl = torch.tensor([0.0, 1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    ov = {5: torch.ones(5, dtype=torch.float64)}
    r = stats.summarize(agree, tie, kl, ov, torch.zeros(5, dtype=torch.float64),
                        nll=torch.full((5,), math.log(4.0), dtype=torch.float64),
                        nll_dense=torch.full((5,), math.log(2.0), dtype=torch.float64))
    assert r["states"] == 5 and r["ties"] == 1 and r["flips"] == 2 and r["flips_outside_ties"] == 1
    assert r["top1_agreement"] == 0.6 and r["flips_per_1k"] == 400.0 and r["flips_outside_ties_per_1k"] == 200.0
    assert r["kl_mean"] == 2.0 and r["kl_median"] == 2.0 and r["kl_max"] == 4.0
    assert r["ppl"] == pytest.approx(4.0) and r["ppl_dense"] == pytest.approx(2.0)
    assert r["dppl_pct"] == pytest.approx(100.0)
    lo, hi = stats.wilson(3, 5)
    assert (r["wilson_lo"], r["wilson_hi"]) == (lo, hi)
