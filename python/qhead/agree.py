"""qhead.agree: what a quantized head does to a real model, measured on its own decode states.

    python -m qhead.agree --model smollm2|gemma3|PATH.gguf|HF_DIR[,...] [--text FILE ...]
                          [--states FILE.safetensors] [--n N] [--schemes w8,w4g64,...]
                          [--rescore 1,2,4,8,16] [--embedding same,dense,[rtn:|mse:]SCHEME,...]
                          [--quantizer rtn,mse,gptq,gptq-mse] [--calibration-states N]
                          [--json OUT.json] [--plot OUT.png] [--threads N]

(``qhead agree ...`` runs this with the same flags.)

**States.** The final hidden state of the model after its last norm, exactly what the head
consumes, captured with transformers in two ways: teacher-forced over the project's corpus
(``qhead.corpus``, six domains; ``--text`` adds the user's files), one state per position, in
windows of ``--window`` tokens; and from generations on the corpus prompts, greedy and sampled
(temperature 0.8, top-p 0.95, seeded), ``--new-tokens`` each. Every state keeps its next token
(the text's, or the one generated). The states, the model's dense head rows and the metadata
(model file sha256, corpus sha256, qhead version, settings, capture time) are saved as one
safetensors file (``--states``; default in ``$QHEAD_STATE_CACHE``, ``~/.cache/qhead/states``),
so that a run is repeated without the model.

**Quantizers.** ``--quantizer`` names one or more (:func:`qhead.quantize`): ``rtn`` (round to
nearest), ``mse`` (per-group scale/clip search on the weights alone), ``gptq`` and ``gptq-mse``
(GPTQ with the Hessian of calibration states, with RTN's or the searched scales; both then refit
the group scales on GPTQ's objective), and ``mse-act`` (the MSE search weighted by the calibration
states' per-column mean square). The calibrated ones use a held-out split: the first ``--calibration-states`` teacher-forced corpus states,
taken from the start of every corpus part in proportion to its size, are the calibration set, and
every quantizer in the run is measured on the other states only (the JSON says which). Schemes of
a bit width without a fused kernel (5, 6, 3 bits) are measured through the reference path: the
packed table is dequantized once (its exact values) and the logits are those of that dense table.

**Comparison.** For each quantizer and scheme (of the model's own dense table, the scale dtype
following the table's dtype), the quantized logits of every state (qhead's logits op) against the dense
logits (``x @ W^T`` in f32), with the statistics of :mod:`qhead.stats`: top-1 agreement with a
Wilson 95% interval, ties (the dense top-1/top-2 margin within the rounding bound of an f32 dot
product over H: ``gamma_H * sum_h |x_h w_h|`` for each of the two logits, plus the rounding to
the model's dtype when that is coarser), flips outside ties, top-5/top-10 overlap, KL(dense ||
quantized) from the full distributions, "same top p" and Δp as llama.cpp's
``llama-perplexity --kl-divergence`` reports them, and the perplexity of the next tokens over
the corpus states. The same figures after exact top-K rescoring (qhead's rescore op on the
dense rows, kept in ``--rescore-dtype``), for each K of ``--rescore``.

``--embedding`` adds the same comparison with the input embedding quantized too, on the measured
corpus states, for every head table of the run. Each entry is ``same`` (each head table serves
the embedding too: a tied model's one packed copy), ``dense`` (an untied pair whose embedding stays
dense) or ``[rtn:|mse:]SCHEME`` (an untied pair: the embedding its own table, ``qhead.hf``'s
``untie=True``). A quantized embedding changes the hidden states, so each runs the model's forward
pass over the corpus again (``same``: once per head table) and needs the model. The records give
the bytes of both tables, so that one copy and the untied pairs compare at their cost.

Output: a Markdown table, ``--json`` (one record per model x scheme x embedding x K) and
``--plot`` (matplotlib: agreement with its interval, and flips per 1000 states, by scheme and K).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import hashlib
import json
import math
import os
import shlex
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

import qhead
from qhead import models as qmodels
from qhead import stats

__all__ = ["States", "capture", "save_states", "load_states", "compare", "run", "format_table", "plot", "main",
           "DEFAULT_SCHEMES", "DEFAULT_RESCORE"]

DEFAULT_SCHEMES = "w8,w8g128,w4g128,w4g64,w4g32,w8a,w8g128a,w4g128a,w4g64a,w4g32a"
DEFAULT_RESCORE = "1,2,4,8,16"
QUANTIZERS = ("rtn", "mse", "mse-act", "gptq", "gptq-mse")
CALIBRATED = ("mse-act", "gptq", "gptq-mse")  # quantizers that read the calibration states
# The harness' names for qhead.quantize's quantizers: mse-act is the MSE search weighted by the
# calibration states' per-column mean square (qhead.quantize(quantizer="mse", calibration=...)).
_QUANTIZER_OF = {"mse-act": "mse"}
DEFAULT_CALIBRATION_STATES = 4096
FUSED_BITS = (4, 8)  # bit widths with fused kernels; others are measured through the reference path
SOURCES = ("corpus", "greedy", "sampled", "text")  # state origins, in the order of their codes
SAMPLING = {"temperature": 0.8, "top_p": 0.95, "top_k": 0, "seed": 1234}
STATES_FORMAT = "qhead-states-1"


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---- states ---------------------------------------------------------------------------------


@dataclass
class States:
    """Decode states of one model: ``hidden`` f32 [N, H], ``target`` int64 [N] (the next token),
    ``source`` int64 [N] (an index into SOURCES), ``part`` int64 [N] (an index into
    ``meta["parts"]``), the dense head rows ``table`` [V, H] and ``meta`` (JSON-able)."""
    hidden: Tensor
    target: Tensor
    source: Tensor
    part: Tensor
    table: Tensor
    meta: Dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.hidden.shape[0])

    def subset(self, idx: Tensor) -> "States":
        return States(self.hidden[idx], self.target[idx], self.source[idx], self.part[idx], self.table,
                      dict(self.meta))


def _windows(stream: List[int], prefix: List[int], window: int) -> List[Tuple[List[int], List[int]]]:
    """(input ids, targets) per window: ``prefix`` (the model's BOS, if any) then up to
    ``window - len(prefix)`` stream tokens; position p predicts the next stream token, so every
    stream token is the target of exactly one state."""
    step = window - len(prefix)
    if step < 1:
        raise ValueError(f"window {window} leaves no room after the {len(prefix)} prefix tokens")
    out = []
    # The state before stream[i] is the one at the position holding stream[i-1] (or the prefix end).
    for s in range(0, len(stream), step):
        chunk = stream[s: s + step]
        if not prefix and s == 0:
            # No BOS: the first token has no state predicting it; start with it as context.
            inp, tgt = chunk[:-1], chunk[1:]
            if not inp:
                continue
        elif not prefix:
            inp, tgt = stream[s - 1: s - 1 + len(chunk)], chunk
        else:
            inp, tgt = prefix + chunk[:-1], chunk
        out.append((inp, tgt))
    return out


def _head_input_recorder(model) -> Tuple[List[Tensor], Any]:
    """A forward pre-hook on the model's output embedding that records its input's last position."""
    seen: List[Tensor] = []

    def hook(_module, args):
        x = args[0]
        seen.append(x[:, -1, :].detach().float().cpu().clone())

    return seen, model.get_output_embeddings().register_forward_pre_hook(hook)


@torch.no_grad()
def _teacher_forced(model, enc, texts: Sequence[Tuple[str, str]], window: int, part_base: int, source: int,
                    log: Callable[[str], None], max_tokens: Optional[int] = None
                    ) -> Tuple[List[Tensor], List[Tensor], List[Tensor], List[Tensor]]:
    """Hidden states (after the last norm) at every position of every text (its first
    ``max_tokens`` tokens when given), with targets."""
    base = model.base_model
    prefix = enc.encode("", bos=True)
    hs, ts, ss, ps = [], [], [], []
    for j, (name, text) in enumerate(texts):
        stream = enc.encode(text, bos=False)
        if max_tokens is not None:
            stream = stream[: max_tokens + (0 if prefix else 1)]
        n = 0
        for inp, tgt in _windows(stream, prefix, window):
            ids = torch.tensor([inp])
            h = base(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state[0]
            hs.append(h.float().cpu())
            ts.append(torch.tensor(tgt, dtype=torch.int64))
            n += len(tgt)
        ss.append(torch.full((n,), source, dtype=torch.int64))
        ps.append(torch.full((n,), part_base + j, dtype=torch.int64))
        log(f"  {name}: {n} states")
    return hs, ts, ss, ps


@torch.no_grad()
def _generated(model, enc, prompts: Sequence[str], new_tokens: int, sample: bool, part_base: int,
               batch: int = 16) -> Tuple[Tensor, Tensor, Tensor]:
    """The head's input at every generation step (greedy or sampled), with the generated token."""
    hs, ts, ps = [], [], []
    if sample:
        torch.manual_seed(SAMPLING["seed"])
    for b0 in range(0, len(prompts), batch):
        group = list(prompts[b0: b0 + batch])
        inp = enc.batch(group)
        seen, handle = _head_input_recorder(model)
        try:
            kw = dict(do_sample=True, temperature=SAMPLING["temperature"], top_p=SAMPLING["top_p"],
                      top_k=SAMPLING["top_k"]) if sample else dict(do_sample=False)
            out = model.generate(**inp, max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=enc.pad_id,
                                 **kw)
        finally:
            handle.remove()
        steps = len(seen)
        new = out[:, inp["input_ids"].shape[1]:]
        if steps != new.shape[1]:
            raise RuntimeError(f"agree: the head ran {steps} times for {new.shape[1]} new tokens")
        h = torch.stack(seen, dim=1)  # [b, steps, H]
        hs.append(h.reshape(-1, h.shape[-1]))
        ts.append(new.reshape(-1).long())
        ps.append((part_base + b0 + torch.arange(len(group))).repeat_interleave(steps))
    return torch.cat(hs), torch.cat(ts), torch.cat(ps)


def _budget(max_states: Optional[int], n_parts: int, n_prompts: int, new_tokens: int,
            generation: bool) -> Tuple[Optional[int], int]:
    """(tokens per corpus part, prompts) for a capture of about ``max_states`` states: three quarters
    teacher-forced, spread over the parts, one quarter generated (greedy and sampled). None: all."""
    if max_states is None:
        return None, n_prompts if generation else 0
    gen = 0
    if generation and n_prompts:
        gen = min(n_prompts, max(1, math.ceil(max_states / 4 / (2 * new_tokens))))
    tf = max_states - gen * 2 * new_tokens
    return max(1, math.ceil(max(tf, 1) / max(n_parts, 1))), gen


def capture(spec: str, *, texts: Sequence[str] = (), window: int = 512, new_tokens: int = 64,
            generation: bool = True, max_states: Optional[int] = None,
            log: Callable[[str], None] = _log) -> States:
    """Loads the model ``spec`` (qhead.models) and captures its decode states (see the module doc).
    ``max_states``: capture about that many (the start of each corpus part and text, and the first
    prompts, spread as :func:`_budget` says) instead of all."""
    from qhead import corpus

    ref = qmodels.resolve(spec)
    t0 = time.time()
    model, enc = qmodels.load(ref)
    t_load = time.time() - t0
    parts = corpus.parts()
    prompts = corpus.prompts()
    per_part, n_prompts = _budget(max_states, len(parts) + len(texts), len(prompts), new_tokens, generation)
    if n_prompts < len(prompts):  # a spread of the prompts, every domain kept where the count allows
        prompts = [prompts[int(i)] for i in _spread(len(prompts), n_prompts)] if n_prompts else []
    user = []
    for path in texts:
        with open(path, encoding="utf-8") as f:
            user.append((os.path.basename(path), f.read()))
    meta_parts = [{"name": p.name, "domain": p.domain, "sha256": p.sha256} for p in parts]
    meta_parts += [{"name": n, "domain": "text", "sha256": _sha256_text(t)} for n, t in user]
    log(f"{ref.name}: capturing teacher-forced states over {len(parts)} corpus parts"
        + (f" and {len(user)} text files" if user else ""))
    t1 = time.time()
    hs, ts, ss, ps = _teacher_forced(model, enc, [(p.name, p.text) for p in parts], window, 0, 0, log,
                                     max_tokens=per_part)
    if user:
        h2, t2, s2, p2 = _teacher_forced(model, enc, user, window, len(parts), SOURCES.index("text"), log,
                                         max_tokens=per_part)
        hs, ts, ss, ps = hs + h2, ts + t2, ss + s2, ps + p2
    t_tf = time.time() - t1
    n_tf = sum(len(t) for t in ts)
    t_gen = 0.0
    if generation and prompts and n_prompts:
        t2 = time.time()
        base = len(meta_parts)
        for sample in (False, True):
            h, t, p = _generated(model, enc, [q.text for q in prompts], new_tokens, sample, base)
            hs.append(h)
            ts.append(t)
            ss.append(torch.full((len(t),), SOURCES.index("sampled" if sample else "greedy"), dtype=torch.int64))
            ps.append(p)
            log(f"  {'sampled' if sample else 'greedy'} generation: {len(t)} states")
        meta_parts += [{"name": q.id, "domain": q.domain, "prompt": True} for q in prompts]
        t_gen = time.time() - t2
    head = model.get_output_embeddings().weight.detach().float().cpu().contiguous()
    dtype = _model_dtype(ref)
    meta = {
        "format": STATES_FORMAT,
        "model": ref.name, "model_spec": spec, "model_kind": ref.kind, "model_file": os.path.basename(ref.path),
        "model_sha256": qmodels.file_sha256(ref.path) if ref.kind == "gguf" else None,
        "model_dtype": str(dtype).replace("torch.", ""),
        "tied": model.get_output_embeddings().weight is model.get_input_embeddings().weight,
        "corpus_sha256": corpus.corpus_sha256(), "parts": meta_parts,
        "window": window, "new_tokens": new_tokens if generation else 0, "sampling": SAMPLING,
        "max_states": max_states, "tokens_per_part": per_part,
        "qhead_version": qhead.__version__, "qhead_commit": qmodels.source_commit(),
        "torch": torch.__version__, "transformers": _transformers_version(),
        "threads": torch.get_num_threads(), "cpu": qmodels.cpu_name(),
        "seconds": {"load": round(t_load, 2), "teacher_forced": round(t_tf, 2), "generation": round(t_gen, 2)},
        "states_teacher_forced": n_tf,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    st = States(torch.cat(hs).contiguous(), torch.cat(ts), torch.cat(ss), torch.cat(ps), head, meta)
    log(f"{ref.name}: {len(st)} states ({n_tf} teacher-forced) in {t_tf + t_gen:.1f} s "
        f"(teacher-forced {t_tf:.1f} s, generation {t_gen:.1f} s, {torch.get_num_threads()} threads)")
    del model
    return st


def _sha256_text(t: str) -> str:
    return hashlib.sha256(t.encode("utf-8")).hexdigest()


def _model_dtype(ref: qmodels.ModelRef) -> torch.dtype:
    """The dtype the model's weights are stored in: the converted GGUF copy is f32; a transformers
    directory says so in config.json (``dtype`` / ``torch_dtype``), else f32."""
    if ref.kind == "hf":
        try:
            with open(os.path.join(ref.path, "config.json")) as f:
                cfg = json.load(f)
            name = cfg.get("dtype") or cfg.get("torch_dtype")
            if name in ("bfloat16", "float16", "float32"):
                return getattr(torch, name)
        except (OSError, ValueError):
            pass
    return torch.float32


def _transformers_version() -> Optional[str]:
    try:
        import transformers

        return transformers.__version__
    except ImportError:
        return None


def save_states(st: States, path: str) -> None:
    """Writes the states as one safetensors file (metadata: the JSON of ``meta``), atomically."""
    from safetensors.torch import save_file

    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = os.path.join(d, f".{os.path.basename(path)}.tmp-{os.getpid()}")
    save_file({"hidden": st.hidden, "target": st.target, "source": st.source, "part": st.part,
               "table": st.table}, tmp, metadata={"qhead_states": json.dumps(st.meta)})
    os.replace(tmp, path)


def load_states(path: str) -> States:
    """Reads a file written by :func:`save_states`; ValueError when it is not one."""
    from safetensors import safe_open

    with safe_open(path, framework="pt") as f:
        md = f.metadata() or {}
        if "qhead_states" not in md:
            raise ValueError(f"agree: {path} is not a qhead states file (no qhead_states metadata)")
        meta = json.loads(md["qhead_states"])
        if meta.get("format") != STATES_FORMAT:
            raise ValueError(f"agree: {path} has format {meta.get('format')!r}, expected {STATES_FORMAT!r}")
        t = {k: f.get_tensor(k) for k in ("hidden", "target", "source", "part", "table")}
    n = t["hidden"].shape[0]
    for k in ("target", "source", "part"):
        if t[k].shape != (n,):
            raise ValueError(f"agree: {path}: {k} has shape {tuple(t[k].shape)}, expected ({n},)")
    if t["hidden"].dim() != 2 or t["table"].dim() != 2 or t["table"].shape[1] != t["hidden"].shape[1]:
        raise ValueError(f"agree: {path}: hidden {tuple(t['hidden'].shape)} and table {tuple(t['table'].shape)} "
                         f"do not match")
    v = t["table"].shape[0]
    if n and (int(t["target"].min()) < 0 or int(t["target"].max()) >= v):
        raise ValueError(f"agree: {path}: a target is outside [0, V = {v})")
    return States(t["hidden"].float(), t["target"].long(), t["source"].long(), t["part"].long(),
                  t["table"].float(), meta)


def state_cache() -> str:
    return os.environ.get("QHEAD_STATE_CACHE", os.path.expanduser("~/.cache/qhead/states"))


def default_states_path(spec: str, texts: Sequence[str], window: int, new_tokens: int, generation: bool,
                        max_states: Optional[int] = None) -> str:
    """The cache file for these capture settings (model file, corpus and user texts by content)."""
    from qhead import corpus

    ref = qmodels.resolve(spec)
    key = [qmodels.file_sha256(ref.path) if ref.kind == "gguf" else os.path.realpath(ref.path),
           corpus.corpus_sha256(), str(window), str(new_tokens if generation else 0), str(max_states)]
    for p in texts:
        with open(p, "rb") as f:
            key.append(hashlib.sha256(f.read()).hexdigest())
    tag = _sha256_text("|".join(key))[:16]
    return os.path.join(state_cache(), f"{ref.name}-{tag}.safetensors")


def calibration_split(st: States, n_cal: int) -> Tuple[Tensor, Tensor]:
    """(calibration indices, the rest): about ``n_cal`` teacher-forced corpus states, the first ones
    of every corpus part in proportion to the part's size (each part's start), and every other
    state. ValueError when there are too few corpus states to leave some to measure."""
    corpus_code = SOURCES.index("corpus")
    corp = (st.source == corpus_code).nonzero().flatten()
    if len(corp) < 2 * n_cal:
        raise ValueError(f"agree: --calibration-states {n_cal} needs at least {2 * n_cal} corpus states to hold out "
                         f"half or less of them; the states hold {len(corp)}")
    parts = st.part[corp]
    cal = []
    total = len(corp)
    for p in parts.unique().tolist():
        idx = corp[parts == p]  # in capture order: the part's text from its start
        k = int(round(n_cal * len(idx) / total))
        cal.append(idx[:k])
    cal_idx = torch.cat(cal).sort().values
    mask = torch.ones(len(st), dtype=torch.bool)
    mask[cal_idx] = False
    return cal_idx, mask.nonzero().flatten()


def select(st: States, n: Optional[int]) -> States:
    """The first-to-last spread of n states (every source and part keeps its share), or all."""
    if n is None or n >= len(st):
        return st
    if n < 1:
        raise ValueError(f"agree: --n {n} must be >= 1")
    return st.subset(_spread(len(st), n))


def _spread(total: int, n: int) -> Tensor:
    """n indices spread evenly over [0, total), first and last included."""
    return torch.linspace(0, total - 1, n).round().long().unique()


# ---- the comparison -------------------------------------------------------------------------


def _chunk_rows(v: int) -> int:
    # About 16 M logits per chunk: a few float64 [B, V] temporaries stay near 1 GiB.
    return max(1, min(512, (1 << 24) // max(v, 1)))


def _tie_flags(x: Tensor, w: Tensor, dense: Tensor, out_dtype: torch.dtype) -> Tensor:
    top = torch.topk(dense, 2, dim=1)
    rows = w[top.indices]  # [B, 2, H]
    abs_dot = (x.abs().unsqueeze(1) * rows.abs()).sum(dim=2).double()
    e = stats.logit_error_bound(abs_dot, top.values, w.shape[1], out_dtype)
    return stats.is_tie(top.values[:, 0], top.values[:, 1], e[:, 0], e[:, 1])


class _Acc:
    """Per-state tensors of one record, gathered over chunks."""

    def __init__(self):
        self.parts: Dict[str, List[Tensor]] = {}

    def add(self, **kw: Optional[Tensor]) -> None:
        for k, t in kw.items():
            if t is not None:
                self.parts.setdefault(k, []).append(t)

    def get(self, k: str) -> Optional[Tensor]:
        return torch.cat(self.parts[k]) if k in self.parts else None


def _rescore_fn(dense_table, x: Tensor) -> Callable[[Tensor], Tensor]:
    """exact(ids [B, C]) -> the exact logits of those ids, aligned with them (qhead's rescore op
    returns them re-sorted; the ids say where each one goes)."""

    def exact(ids: Tensor) -> Tensor:
        vals, got = qhead.rescore(dense_table, x, ids.to(torch.int32).contiguous())
        got = got.long()
        order_in = torch.argsort(ids, dim=1)
        order_got = torch.argsort(got, dim=1)
        out = torch.empty_like(vals)
        out.scatter_(1, order_in, vals.gather(1, order_got))
        return out

    return exact


def compare(hidden: Tensor, table: Tensor, tables: Dict[str, Any], ks: Sequence[int], *,
            targets: Optional[Tensor] = None, dense_hidden: Optional[Tensor] = None,
            rescore_dtype: torch.dtype = torch.float32, out_dtype: torch.dtype = torch.float32,
            log: Callable[[str], None] = _log, modes: Optional[Dict[str, str]] = None
            ) -> Tuple[Dict[Tuple[str, int], _Acc], Tensor, Optional[Tensor]]:
    """Per-state statistics of every quantized table in ``tables`` (name -> qhead.Table, or the
    dequantized f32 [V, H] values of one as a tensor) against
    the dense head ``table`` [V, H] on the states ``hidden`` [N, H], for K = 0 and each K in
    ``ks``. ``dense_hidden``: the states the dense model had at the same positions, when
    ``hidden`` are those of a model whose embedding is quantized (the dense logits come from
    them). Returns ({(name, K): accumulated per-state tensors}, tie flags [N], dense NLL [N])."""
    w = table.float().contiguous()
    v = w.shape[0]
    dense_rows = qhead.Table.dense(w if rescore_dtype == torch.float32 else w.to(rescore_dtype).contiguous())
    accs = {(name, k): _Acc() for name in tables for k in [0, *ks]}
    ties, nll_dense = [], []
    b = _chunk_rows(v)
    n = hidden.shape[0]
    t0, last = time.time(), time.time()
    for s in range(0, n, b):
        x = hidden[s: s + b].float().contiguous()
        xd = x if dense_hidden is None else dense_hidden[s: s + b].float().contiguous()
        dense = xd @ w.T
        tgt = targets[s: s + b] if targets is not None else None
        ties.append(_tie_flags(xd, w, dense, out_dtype))
        dr = stats.DenseRows.of(dense, tgt)
        del dense
        if dr.nll is not None:
            nll_dense.append(dr.nll)
        exact = _rescore_fn(dense_rows, x)
        for name, tab in tables.items():
            # A torch tensor: the dequantized values of a table without fused kernels (the
            # reference path), multiplied in f32 by BLAS.
            if isinstance(tab, Tensor):
                q = x @ tab.T
            else:
                qhead.set_cpu_activations((modes or {}).get(name, "exact"))
                try:
                    q = qhead.logits(tab, x)
                finally:
                    qhead.set_cpu_activations("exact")
            per = stats.compare_logits(dr, q, [0, *ks], exact=exact)
            for k, r in per.items():
                accs[(name, k)].add(agree=r.agree, displaced=r.displaced, kl=r.kl, dp_top=r.dp_top, dp_target=r.dp_target, nll=r.nll,
                                    ov5=r.overlap[5], ov10=r.overlap[10])
        if time.time() - last > 30:
            last = time.time()
            done = min(n, s + b)
            log(f"  {done}/{n} states, {last - t0:.0f} s")
    return accs, torch.cat(ties), (torch.cat(nll_dense) if nll_dense else None)


def _records(accs, ties: Tensor, nll_dense: Optional[Tensor], source: Tensor, base: Dict[str, Any],
             order: Sequence[str], labels: Optional[Dict[str, Dict[str, Any]]] = None) -> List[Dict[str, Any]]:
    """One record per (table, K) of ``accs``, in the order of ``order`` then K. ``labels``: the
    fields each table name stands for (default: ``{"scheme": name}``)."""
    out = []
    text_mask = (source == SOURCES.index("corpus")) | (source == SOURCES.index("text"))
    for (name, k), a in sorted(accs.items(), key=lambda it: (list(order).index(it[0][0]), it[0][1])):
        agree = a.get("agree")
        nll, dpt = a.get("nll"), a.get("dp_target")
        r = dict(base)
        r.update(labels[name] if labels else {"scheme": name})
        r.update(rescore=k)
        r.update(stats.summarize(
            agree, ties, a.get("kl"), {5: a.get("ov5"), 10: a.get("ov10")}, a.get("dp_top"),
            dp_target=dpt[text_mask] if dpt is not None else None,
            nll=nll[text_mask] if nll is not None else None,
            nll_dense=nll_dense[text_mask] if nll_dense is not None else None))
        by = {}
        for i, src in enumerate(SOURCES):
            m = source == i
            cnt = int(m.sum())
            if cnt:
                kk = int(agree[m].sum())
                lo, hi = stats.wilson(kk, cnt)
                by[src] = {"states": cnt, "ties": int(ties[m].sum()), "top1_agreement": kk / cnt,
                           "wilson_lo": lo, "wilson_hi": hi, "flips_outside_ties": int((~agree[m] & ~ties[m]).sum())}
        r["displaced"] = int(a.get("displaced").sum())
        r["by_source"] = by
        out.append(r)
    return out


def _parse_list(s: str, what: str) -> List[str]:
    items = [t.strip() for t in s.split(",") if t.strip()]
    if not items:
        raise ValueError(f"agree: {what} is empty")
    return items


def run(models: Sequence[str], *, states: Optional[str] = None, texts: Sequence[str] = (), n: Optional[int] = None,
        schemes: Sequence[str] = tuple(DEFAULT_SCHEMES.split(",")), rescore: Sequence[int] = (1, 2, 4, 8, 16),
        embedding: Sequence[str] = (), quantizer: Any = "rtn", rescore_dtype: str = "f32",
        scale_dtype: Optional[str] = None, window: int = 512, new_tokens: int = 64, generation: bool = True,
        capture_all: bool = False, calibration_states: int = DEFAULT_CALIBRATION_STATES,
        cpu_activations: Sequence[str] = ("exact",),
        log: Callable[[str], None] = _log) -> Dict[str, Any]:
    """The whole harness (the CLI's work): returns {"meta": ..., "records": [...], "models": {...}}.
    With ``n`` and no states file yet, about n states are captured (not all the corpus) unless
    ``capture_all``. ``quantizer``: a name or a list of names (QUANTIZERS); with a calibrated one,
    ``calibration_states`` corpus states are held out as its calibration set and every quantizer is
    measured on the rest. ``cpu_activations``: the CPU kernels' activation modes each fused table
    is measured in ("exact", "int8": qhead.set_cpu_activations); records of the int8 mode carry
    ``"activations": "int8"``."""
    acts = list(dict.fromkeys(cpu_activations))
    for a in acts:
        if a not in ("exact", "int8"):
            raise ValueError(f"agree: --cpu-activations {a!r}: exact or int8")
    if not acts:
        raise ValueError("agree: --cpu-activations is empty")
    quantizers = [quantizer] if isinstance(quantizer, str) else list(quantizer)
    if not quantizers:
        raise ValueError("agree: --quantizer is empty")
    for q in quantizers:
        if q not in QUANTIZERS:
            raise ValueError(f"agree: --quantizer {q!r}: one of {', '.join(QUANTIZERS)}")
    calibrated = any(q in CALIBRATED for q in quantizers)
    if calibrated and calibration_states < 1:
        raise ValueError(f"agree: --calibration-states {calibration_states} must be >= 1")
    ks = sorted(set(int(k) for k in rescore))
    if any(k < 1 for k in ks):
        raise ValueError(f"agree: --rescore values must be >= 1, got {list(rescore)}")
    if states is not None and len(models) != 1:
        raise ValueError("agree: --states names one file: give one --model with it")
    rdt = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}.get(rescore_dtype)
    if rdt is None:
        raise ValueError(f"agree: --rescore-dtype {rescore_dtype!r}: one of f32, bf16, f16")
    for s in list(schemes):
        qhead.Scheme(s)  # a bad name raises qhead.InvalidArgumentError naming it
    for e in embedding:
        parse_embedding(e)
    t_start = time.time()
    commit = qmodels.source_commit()  # the source the run starts from
    capture_max = None if (n is None or capture_all) else n
    records: List[Dict[str, Any]] = []
    model_meta: Dict[str, Any] = {}
    for spec in models:
        path = states or default_states_path(spec, texts, window, new_tokens, generation, capture_max)
        if os.path.isfile(path):
            st = load_states(path)
            log(f"{st.meta['model']}: {len(st)} states from {path}")
        else:
            st = capture(spec, texts=texts, window=window, new_tokens=new_tokens, generation=generation,
                         max_states=capture_max, log=log)
            save_states(st, path)
            log(f"{st.meta['model']}: states saved to {path}")
        full = st
        calib_meta = None
        calib = cal_idx = None
        if calibrated:
            cal_idx, rest_idx = calibration_split(full, calibration_states)
            calib = full.hidden[cal_idx].contiguous()
            calib_meta = {"states": int(len(cal_idx)), "measured_on": "the other states only",
                          "rule": "the first teacher-forced corpus states of every corpus part, in proportion "
                                  "to the part's size (a held-out split: none of them is measured)"}
            full_measured = full.subset(rest_idx)
        else:
            full_measured = full
        st = select(full_measured, n)
        w = st.table
        mdt = getattr(torch, st.meta.get("model_dtype", "float32"))
        sd = scale_dtype or {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}[mdt]
        tables, labels, skipped, t_quant, modes = {}, {}, {}, {}, {}
        for q in quantizers:
            for s in schemes:
                name = s if len(quantizers) == 1 else f"{q}:{s}"
                t0 = time.time()
                try:
                    tab = qhead.quantize(w, s, scale_dtype=sd, quantizer=_QUANTIZER_OF.get(q, q),
                                         calibration=calib if q in CALIBRATED else None)
                except qhead.InvalidArgumentError as e:  # e.g. a group size that does not divide H
                    skipped[s] = str(e)
                    log(f"{st.meta['model']}: {s} skipped: {e}")
                    continue
                t_quant[f"{q}:{s}"] = round(time.time() - t0, 2)
                nbytes = int(tab.nbytes)
                path_kind = "fused" if qhead.Scheme(s).bits in FUSED_BITS else "reference (dequantized)"
                if path_kind != "fused":
                    tab = torch.from_numpy(tab.dequantize())
                for a in (acts if path_kind == "fused" else acts[:1]):
                    key = name if a == acts[0] else f"{name}@{a}"
                    tables[key] = tab
                    labels[key] = {"scheme": s, "quantizer": q, "path": path_kind,
                                   "activations": a if path_kind == "fused" else "exact", "head_bytes": nbytes}
                    modes[key] = a if path_kind == "fused" else "exact"
        log(f"{st.meta['model']}: {len(tables)} tables quantized ({', '.join(quantizers)}) in "
            f"{sum(t_quant.values()):.1f} s; comparing {len(st)} states, K = 0, {', '.join(map(str, ks))}")
        t1 = time.time()
        accs, ties, nll_d = compare(st.hidden, w, tables, ks, targets=st.target, rescore_dtype=rdt, out_dtype=mdt,
                                    log=log, modes=modes)
        base = {"model": st.meta["model"], "quantizer": quantizers[0], "embedding": "dense", "scale_dtype": sd,
                "rescore_dtype": rescore_dtype}
        records += _records(accs, ties, nll_d, st.source, base, list(tables), labels)
        t_cmp = time.time() - t1
        emb_specs = [e for e in embedding if e != "none"]
        t_emb = 0.0
        if emb_specs:
            t2 = time.time()
            head_keys = [k for k in tables if labels[k]["activations"] == acts[0]]
            records += _embedding_records(spec, full, st, emb_specs, {k: tables[k] for k in head_keys}, labels,
                                          calib, cal_idx, ks, sd, rdt, mdt, rescore_dtype, log)
            t_emb = time.time() - t2
        model_meta[st.meta["model"]] = {
            **{k: st.meta.get(k) for k in ("model_file", "model_sha256", "model_dtype", "tied", "corpus_sha256",
                                            "qhead_commit", "window", "new_tokens", "sampling", "seconds",
                                            "states_teacher_forced", "cpu", "threads")},
            "vocab": int(w.shape[0]), "hidden": int(w.shape[1]), "states_file": os.path.basename(path),
            "states": len(st), "states_captured": len(full),
            "seconds_compare": round(t_cmp, 1), "seconds_quantize": round(sum(t_quant.values()), 2),
            "seconds_quantize_each": t_quant, "quantizers": quantizers, "calibration": calib_meta,
            "seconds_embedding": round(t_emb, 1), "skipped": skipped,
        }
    meta = {
        "tool": "qhead agree", "qhead_version": qhead.__version__, "qhead_commit": commit,
        "torch": torch.__version__, "transformers": _transformers_version(), "cpu": qmodels.cpu_name(),
        "threads": torch.get_num_threads(), "qhead_threads": qhead.num_threads(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(time.time() - t_start, 1),
        "tie_rule": "dense top1 - top2 <= e1 + e2, e = gamma_H(f32) * sum_h |x_h w_h| (+ u_dtype |l| for a "
                    "model dtype coarser than f32)",
    }
    return {"meta": meta, "models": model_meta, "records": records}


def parse_embedding(e: str) -> Tuple[str, Optional[str], Optional[str]]:
    """An --embedding entry: ("same", None, None), ("dense", None, None) or ("pair", quantizer,
    scheme) for ``[rtn:|mse:]SCHEME``. ValueError / qhead.InvalidArgumentError for a bad one."""
    if e in ("same", "dense"):
        return e, None, None
    q, _, sch = e.rpartition(":")
    q = q or "rtn"
    if q not in ("rtn", "mse"):
        raise ValueError(f"agree: --embedding {e!r}: an untied embedding is quantized with rtn or mse (its inputs "
                         "are token ids: no calibration), as rtn:SCHEME or mse:SCHEME")
    qhead.Scheme(sch)
    return "pair", q, sch


@torch.no_grad()
def _embedding_records(spec, full: States, st: States, emb_specs, tables, labels, calib, cal_idx, ks, sd, rdt, mdt,
                       rescore_dtype, log) -> List[Dict[str, Any]]:
    """The comparison with the input embedding quantized too, on the measured corpus states: the
    corpus teacher-forced again through the model whose embedding reads a quantized table, its
    hidden states into every head table of the run, against the dense model at the same
    positions. Each entry of ``emb_specs``:
      "same"          each head table serves the embedding too (a tied model: the one-copy model);
      "dense"         an untied pair with the dense embedding (the head's figures on these states);
      "[rtn:|mse:]S"  an untied pair: the embedding its own table, scheme S.
    Records carry "pair" ("one copy" | "untied") and the bytes of the embedding and head tables."""
    import qhead.hf as qh
    from qhead import corpus

    corpus_code = SOURCES.index("corpus")
    corp = (full.source == corpus_code).nonzero().flatten()  # full's corpus states, in capture order
    keep = torch.ones(len(corp), dtype=torch.bool)
    if cal_idx is not None:
        keep &= ~torch.isin(corp, cal_idx)  # the calibration states are never measured
    local = keep.nonzero().flatten()
    n_measured = len(full) - (0 if cal_idx is None else len(cal_idx))
    if len(st) < n_measured:  # --n: the same share of the corpus states
        local = local[_spread(len(local), max(1, round(len(local) * len(st) / n_measured)))]
    dense_hidden = full.hidden[corp[local]]
    targets = full.target[corp[local]]
    names = [p["name"] for p in full.meta["parts"]]
    parts = [p for p in corpus.parts() if p.name in names]
    w = full.table
    dense_bytes = int(w.shape[0] * w.shape[1] * torch.empty((), dtype=mdt).element_size())
    model_name = full.meta["model"]

    def hidden_of(setup) -> Tensor:
        """The corpus' hidden states of the model after setup(model), at the measured positions."""
        ref = qmodels.resolve(spec)
        model, enc = qmodels.load(ref)
        tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
        setup(model, tied)
        hs, ts, _, _ = _teacher_forced(model, enc, [(p.name, p.text) for p in parts], full.meta["window"], 0, 0,
                                       lambda m: None, max_tokens=full.meta.get("tokens_per_part"))
        del model
        if not torch.equal(torch.cat(ts), full.target[corp]):
            raise RuntimeError("agree: the corpus tokenized differently from the saved states")
        return torch.cat(hs)[local]

    def measure(h, keys, emb_label, pair, emb_bytes) -> List[Dict[str, Any]]:
        accs, ties, nll_d = compare(h, w, {k: tables[k] for k in keys}, ks, targets=targets, dense_hidden=dense_hidden,
                                    rescore_dtype=rdt, out_dtype=mdt, log=log)
        base = {"model": model_name, "embedding": emb_label, "pair": pair, "scale_dtype": sd,
                "rescore_dtype": rescore_dtype}
        lab = {k: dict(labels[k], embedding_bytes=int(emb_bytes if emb_bytes is not None else 0),
                       table_bytes=int(labels[k]["head_bytes"] + (emb_bytes or 0))) for k in keys}
        return _records(accs, ties, nll_d, torch.zeros(len(h), dtype=torch.int64), base, list(keys), lab)

    out: List[Dict[str, Any]] = []
    for e in emb_specs:
        kind, eq, es = parse_embedding(e)
        t0 = time.time()
        if kind == "dense":
            out += measure(dense_hidden, list(tables), "dense", "untied", dense_bytes)
        elif kind == "same":
            for k in tables:
                lab = labels[k]
                q = lab["quantizer"]

                def setup(model, tied, lab=lab, q=q):
                    qq = _QUANTIZER_OF.get(q, q)
                    c = calib if q in CALIBRATED else None
                    if tied:
                        qh.quantize_model(model, head=lab["scheme"], scale_dtype=sd, quantizer=qq, calibration=c)
                    else:
                        qh.quantize_model(model, head=lab["scheme"], embedding=lab["scheme"], scale_dtype=sd,
                                          quantizer=qq, calibration=c)

                h = hidden_of(setup)
                out += measure(h, [k], "same", "one copy", 0)
        else:
            emb_bytes = {}

            def setup(model, tied, eq=eq, es=es):
                qh.quantize_model(model, head=es, embedding=es, scale_dtype=sd, quantizer=eq, untie=True)
                emb_bytes["n"] = int(model.get_input_embeddings().table.nbytes)

            h = hidden_of(setup)
            out += measure(h, list(tables), f"{eq}:{es}", "untied", emb_bytes["n"])
        log(f"{model_name} embedding {e}: {len(local)} corpus states in {time.time() - t0:.1f} s")
    return out


# ---- output ---------------------------------------------------------------------------------


def _pct(x: float) -> str:
    return f"{100.0 * x:.3f}"


def format_table(result: Dict[str, Any]) -> str:
    """The records as a Markdown table."""
    lines = ["| model | quantizer | scheme | embedding | K | states | ties | top-1 agreement % [95% CI] | flips/1k "
             "(outside ties) | top-5 | top-10 | KL mean | KL p99 | KL p99.9 | Δp top % | Δppl % |",
             "|---|---|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result["records"]:
        dppl = f"{r['dppl_pct']:+.2f}" if "dppl_pct" in r else "-"
        lines.append(
            f"| {r['model']} | {r.get('quantizer', 'rtn')} | {r['scheme']}{' (int8 x)' if r.get('activations') == 'int8' else ''} | "
            f"{r['embedding']}{' (' + r['pair'] + ')' if 'pair' in r else ''} | {r['rescore']} | {r['states']} | "
            f"{r['ties']} | "
            f"{_pct(r['top1_agreement'])} [{_pct(r['wilson_lo'])}, {_pct(r['wilson_hi'])}] | "
            f"{r['flips_per_1k']:.2f} ({r['flips_outside_ties_per_1k']:.2f}) | {r['top5_overlap']:.4f} | "
            f"{r['top10_overlap']:.4f} | {r['kl_mean']:.2e} | {r['kl_p99']:.2e} | {r['kl_p999']:.2e} | "
            f"{r['dp_top_mean_pct']:+.3f} | {dppl} |")
    return "\n".join(lines)


def plot(result: Dict[str, Any], path: str) -> None:
    """Agreement (with its Wilson interval) and flips per 1000 states by scheme and K, one row of two
    panels per model (head-only records)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = [r for r in result["records"] if r["embedding"] == "dense" and "pair" not in r]
    models = list(dict.fromkeys(r["model"] for r in recs))
    fig, axes = plt.subplots(len(models), 2, figsize=(13, 4.2 * len(models)), squeeze=False)
    for row, m in enumerate(models):
        rs = [r for r in recs if r["model"] == m]
        many = len(set(r.get("quantizer", "rtn") for r in rs)) > 1
        int8 = any(r.get("activations") == "int8" for r in rs)

        def name(r, many=many, int8=int8):
            n = f"{r.get('quantizer', 'rtn')} {r['scheme']}" if many else r["scheme"]
            return n + (f" {r.get('activations', 'exact')}" if int8 else "")
        schemes = list(dict.fromkeys(name(r) for r in rs))
        ks = sorted(set(r["rescore"] for r in rs))
        width = 0.8 / len(ks)
        ax, bx = axes[row]
        for j, k in enumerate(ks):
            xs, ys, lo, hi, fl = [], [], [], [], []
            for i, s in enumerate(schemes):
                r = next((r for r in rs if name(r) == s and r["rescore"] == k), None)
                if r is None:
                    continue
                xs.append(i + (j - (len(ks) - 1) / 2) * width)
                ys.append(100 * r["top1_agreement"])
                lo.append(max(0.0, 100 * (r["top1_agreement"] - r["wilson_lo"])))
                hi.append(max(0.0, 100 * (r["wilson_hi"] - r["top1_agreement"])))
                fl.append(r["flips_per_1k"])
            label = "no rescoring" if k == 0 else f"K = {k}"
            ax.errorbar(xs, ys, yerr=[lo, hi], fmt="o", ms=4, capsize=2, label=label)
            bx.bar(xs, fl, width=width, label=label)
        for a in (ax, bx):
            a.set_xticks(range(len(schemes)))
            a.set_xticklabels(schemes, rotation=30)
            a.grid(axis="y", alpha=0.3)
        n = rs[0]["states"] if rs else 0
        ax.set_title(f"{m}: top-1 agreement with the dense head ({n} states, 95% Wilson)")
        ax.set_ylabel("%")
        bx.set_title(f"{m}: flips per 1000 states")
        bx.set_yscale("symlog", linthresh=1.0)
        ax.legend(fontsize=7, ncol=2)
        bx.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = os.path.join(d, f".{os.path.basename(path)}.tmp-{os.getpid()}.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)


def _write_json(obj: Any, path: str) -> None:
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = os.path.join(d, f".{os.path.basename(path)}.tmp-{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def _ints(s: str, what: str) -> List[int]:
    try:
        return [int(t) for t in _parse_list(s, what)]
    except ValueError as e:
        raise ValueError(f"agree: {what} must be a comma list of integers, got {s!r}") from e


def _usage_error(e: BaseException) -> None:
    msg = str(e)
    print("qhead " + (msg if msg.startswith("agree:") else "agree: " + msg), file=sys.stderr)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="qhead agree",
        description="Agreement, KL and perplexity of quantized heads against the dense head, on a real "
                    "model's decode states.")
    ap.add_argument("--model", required=True, help="smollm2, gemma3, a .gguf file or a transformers model directory "
                                                    "(a comma list for several)")
    ap.add_argument("--text", action="append", default=[], metavar="FILE",
                    help="add this UTF-8 text to the teacher-forced states (repeatable)")
    ap.add_argument("--states", help="the states file: read when it exists, else captured and written there "
                                     "(default: a file in $QHEAD_STATE_CACHE keyed by model, corpus and settings)")
    ap.add_argument("--n", type=int, help="use this many states, spread over all of them (default: all); without a "
                                          "states file, about this many are captured")
    ap.add_argument("--capture-all", action="store_true", help="with --n: capture the whole corpus and prompt set")
    ap.add_argument("--schemes", default=DEFAULT_SCHEMES, help=f"comma list (default {DEFAULT_SCHEMES})")
    ap.add_argument("--rescore", default=DEFAULT_RESCORE, help="exact top-K rescoring for each K (comma list; "
                                                               "K = 0, no rescoring, always runs)")
    ap.add_argument("--rescore-dtype", default="f32", choices=("f32", "bf16", "f16"),
                    help="the dtype of the dense rows kept for rescoring (default f32)")
    ap.add_argument("--embedding", default="none",
                    help="the input embedding quantized too, each head table measured with it (comma list): same "
                         "(each head table serves the embedding: one copy), dense (an untied pair, dense embedding), "
                         "[rtn:|mse:]SCHEME (an untied pair: the embedding's own table); default none")
    ap.add_argument("--quantizer", default="rtn",
                    help="how the table is quantized, a comma list of: rtn (round to nearest), mse (per-group "
                         "scale/clip search), mse-act (the same weighted by the calibration states), gptq, gptq-mse "
                         "(GPTQ on held-out calibration states, RTN's or the searched scales; default rtn)")
    ap.add_argument("--calibration-states", type=int, default=DEFAULT_CALIBRATION_STATES,
                    help=f"corpus states held out as GPTQ's calibration set (default {DEFAULT_CALIBRATION_STATES}); "
                         "with a GPTQ quantizer every quantizer is measured on the other states")
    ap.add_argument("--scale-dtype", choices=("f32", "f16", "bf16"), help="default: the model's dtype")
    ap.add_argument("--cpu-activations", default="exact",
                    help="the CPU kernels' activation modes to measure each fused table in, comma list of exact, "
                         "int8 (default exact; int8: qhead.set_cpu_activations)")
    ap.add_argument("--window", type=int, default=512, help="teacher-forced window in tokens (default 512)")
    ap.add_argument("--new-tokens", type=int, default=64, help="tokens per generation (default 64)")
    ap.add_argument("--no-generation", action="store_true", help="teacher-forced states only")
    ap.add_argument("--threads", type=int, default=0, help="torch and qhead CPU threads (default: theirs)")
    ap.add_argument("--json", metavar="OUT.json", help="write every record here")
    ap.add_argument("--plot", metavar="OUT.png", help="write the plot here")
    args = ap.parse_args(argv)
    try:
        if args.n is not None and args.n < 1:
            raise ValueError(f"agree: --n {args.n} must be >= 1")
        if args.window < 2:
            raise ValueError(f"agree: --window {args.window} must be >= 2")
        if args.new_tokens < 1:
            raise ValueError(f"agree: --new-tokens {args.new_tokens} must be >= 1")
        if args.threads < 0:
            raise ValueError(f"agree: --threads {args.threads} must be >= 0")
        models = _parse_list(args.model, "--model")
        if args.plot:
            import importlib.util

            if importlib.util.find_spec("matplotlib") is None:
                raise ValueError("agree: --plot needs the matplotlib package (pip install matplotlib)")
        for t in args.text:
            if not os.path.isfile(t):
                raise FileNotFoundError(f"agree: --text {t}: no such file")
        schemes = _parse_list(args.schemes, "--schemes")
        ks = _ints(args.rescore, "--rescore")
        emb = [] if args.embedding in ("none", "") else _parse_list(args.embedding, "--embedding")
        quantizers = _parse_list(args.quantizer, "--quantizer")
        acts = _parse_list(args.cpu_activations, "--cpu-activations")
        for a in acts:
            if a not in ("exact", "int8"):
                raise ValueError(f"agree: --cpu-activations {a!r}: exact or int8")
        for q in quantizers:
            if q not in QUANTIZERS:
                raise ValueError(f"agree: --quantizer {q!r}: one of {', '.join(QUANTIZERS)}")
        for s in schemes:
            qhead.Scheme(s)  # a bad name raises qhead.InvalidArgumentError naming it
        for e in emb:
            parse_embedding(e)
        # The model last: a bad argument is reported even where the model is not at hand.
        for m in models:
            ref = qmodels.resolve(m)
            if not (args.states and os.path.isfile(args.states)):
                why = qmodels.unavailable(ref)
                if why:
                    raise FileNotFoundError(f"agree: model {m}: {why}")
    except (ValueError, FileNotFoundError, qhead.Error) as e:
        _usage_error(e)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
        qhead.set_num_threads(args.threads)
    try:
        result = run(models, states=args.states, texts=args.text, n=args.n, schemes=schemes, rescore=ks,
                     embedding=emb, quantizer=quantizers, calibration_states=args.calibration_states,
                     rescore_dtype=args.rescore_dtype,
                     scale_dtype=args.scale_dtype, window=args.window, new_tokens=args.new_tokens,
                     generation=not args.no_generation, capture_all=args.capture_all, cpu_activations=acts)
    except (ValueError, qhead.Error) as e:
        _usage_error(e)
        return 2
    result["meta"]["command"] = "qhead agree " + " ".join(shlex.quote(a) for a in (argv if argv is not None
                                                                                     else sys.argv[1:]))
    print(format_table(result))
    if args.json:
        _write_json(result, args.json)
        print(f"\nrecords: {args.json}")
    if args.plot:
        plot(result, args.plot)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
