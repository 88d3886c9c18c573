"""qhead.generate: greedy generation with a qhead-quantized token table beside the dense model's.

    python -m qhead.generate --model smollm2|gemma3|PATH.gguf|HF_DIR [--head SCHEME] [--embedding SCHEME]
           [--rescore K] [--quantizer Q] [--calibration STATES.safetensors] [--untie]
           [--dense-rows cpu|device|FILE] [--prompt TEXT ...] [--validation]
           [--new-tokens 64] [--device cpu|cuda] [--threads N] [--json OUT.json]

``qhead generate ARGS...`` runs the same command.

The model (``qhead.models``: a short name, a .gguf file or a transformers directory) is loaded
once, in f32. Every prompt is decoded greedily at batch 1 (decode at M = 1, as a user runs
it) by transformers' ``generate``, exactly ``--new-tokens`` new tokens (EOS does not stop it),
first with the dense model; then the same model's token tables are quantized in place
(``qhead.hf.quantize_model``: a tied table becomes one packed table serving both roles) and
every prompt is decoded again. Each of the two timed passes starts with one short untimed
``generate`` (warm-up), so neither pays for first calls; nothing else differs between them.

Measured for each pass:

* tokens/s: the new tokens over the wall time of the ``generate`` calls (prefill included);
* the head's share of that time: the time inside the output-embedding module's forward
  (forward pre/post hooks, ``time.perf_counter``, synchronizing on CUDA), and the head's time
  per call (one call per new token: transformers computes the logits of the last position only);
* the bytes the head reads per call (dense: V * H * element size; packed: the table's bytes,
  plus the K rows rescoring reads) and the rate that makes (bytes / head time per call);
* the token table's memory: ``qhead.hf.token_table_bytes`` (the distinct storages behind both
  roles, a tied table once, rescoring rows included).

On CUDA the model is moved there in f32: the dense head is an f32 GEMV; qhead's CUDA kernels
take f16/bf16 activations, so ``QuantLMHead`` rounds the f32 hidden state to bf16 for them
(rescoring uses the f32 state). ``--dense-rows cpu`` (the default) keeps the rescoring rows in
CPU memory (the candidates are rescored there); ``device`` puts them on the GPU.

The prompts are each ``--prompt`` given, else the corpus's validation prompts
(``qhead.corpus.prompts(validation=True)``). ``--json`` writes every number, the texts and
token ids, with the versions, the model file's sha256, the device, the threads, the command
line and the date. :func:`run` and :func:`format_report` are the Python API.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import os
import shlex
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import qhead
from qhead import models as qmodels

__all__ = ["ArgumentError", "run", "format_report", "greedy", "first_diff", "validation_prompts", "HeadClock", "main"]

# Scheme names that keep a role dense.
DENSE_NAMES = ("dense", "none")
WARMUP_TOKENS = 2


class ArgumentError(qhead.InvalidArgumentError):
    """A bad argument of :func:`run`; ``param`` names it (``--param`` on the command line)."""

    def __init__(self, param: str, message: str):
        super().__init__(f"{param}: {message}")
        self.param = param
        self.reason = message


# ---- arguments --------------------------------------------------------------------------------


def _scheme(param: str, name: Optional[str]) -> Optional[str]:
    """The scheme name for a role (None: the role stays dense)."""
    if name is None or name.lower() in DENSE_NAMES:
        return None
    try:
        return qhead.Scheme(name).name
    except qhead.Error as e:
        raise ArgumentError(param, f"{name!r} is not a qhead scheme ({e})") from None


QUANTIZERS = ("rtn", "mse", "gptq", "gptq-mse")


def _check(model_spec: str, head: Optional[str], embedding: Optional[str], rescore: int, new_tokens: int,
           device: str, dense_rows: str, threads: int, quantizer: str = "rtn", calibration: Optional[str] = None,
           untie: bool = False) -> Tuple[qmodels.ModelRef, Optional[str], Optional[str]]:
    """Checks every argument before anything is loaded; (model ref, head scheme, embedding scheme)."""
    hs, es = _scheme("head", head), _scheme("embedding", embedding)
    if hs is None and es is None:
        raise ArgumentError("head", "head and embedding are both dense: nothing to quantize")
    if quantizer not in QUANTIZERS:
        raise ArgumentError("quantizer", f"{quantizer!r}: one of {', '.join(QUANTIZERS)}")
    if quantizer in ("gptq", "gptq-mse") and calibration is None:
        raise ArgumentError("calibration", f"--quantizer {quantizer} needs the head's inputs: a states file "
                                           "(qhead agree --states FILE writes one)")
    if calibration is not None and not os.path.isfile(calibration.rsplit(":", 1)[0] if not os.path.isfile(calibration)
                                                      else calibration):
        raise ArgumentError("calibration", f"{calibration!r}: no such file")
    if untie and hs is None:
        raise ArgumentError("untie", "untying gives the head its own table: give --head SCHEME")
    if not isinstance(rescore, int) or rescore < 0:
        raise ArgumentError("rescore", f"K = {rescore} must be an integer >= 0")
    if not isinstance(new_tokens, int) or new_tokens < 1:
        raise ArgumentError("new-tokens", f"{new_tokens} must be an integer >= 1")
    if not isinstance(threads, int) or threads < 0:
        raise ArgumentError("threads", f"{threads} must be >= 0 (0: the libraries' defaults)")
    if not (device == "cpu" or device == "cuda" or device.startswith("cuda:")):
        raise ArgumentError("device", f"{device!r}: expected cpu or cuda")
    if dense_rows not in ("cpu", "device") and not os.path.isfile(dense_rows):
        raise ArgumentError("dense-rows", f"{dense_rows!r}: expected cpu, device or a safetensors file that exists")
    try:
        ref = qmodels.resolve(model_spec)
    except ValueError as e:
        raise ArgumentError("model", str(e)) from None
    why = qmodels.unavailable(ref)
    if why:
        raise ArgumentError("model", f"{model_spec!r}: {why}")
    return ref, hs, es


def validation_prompts() -> List[Any]:
    """The corpus's validation prompts (objects with ``.id``, ``.domain``, ``.text``)."""
    try:
        from qhead import corpus
    except ImportError as e:
        raise ArgumentError("prompt", f"no prompt given and the validation prompts (qhead.corpus) cannot be "
                                      f"imported ({e}): give --prompt TEXT") from None
    return list(corpus.prompts(validation=True))


def _prompt_rows(prompts: Optional[Sequence[Any]]) -> List[Dict[str, Any]]:
    """[{id, domain, text}] of strings or corpus Prompts (None: the validation prompts)."""
    rows = []
    for i, p in enumerate(validation_prompts() if prompts is None else prompts):
        if isinstance(p, str):
            rows.append({"id": f"prompt-{i}", "domain": None, "text": p})
        else:
            rows.append({"id": str(p.id), "domain": getattr(p, "domain", None), "text": str(p.text)})
    if not rows:
        raise ArgumentError("prompt", "no prompts")
    for r in rows:
        if not r["text"]:
            raise ArgumentError("prompt", f"prompt {r['id']} is empty")
    return rows


# ---- timing -----------------------------------------------------------------------------------


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


class HeadClock:
    """Time spent inside one module's forward (the output embedding): forward pre/post hooks
    read ``time.perf_counter`` (after synchronizing the GPU when the module runs on CUDA).
    ``with HeadClock(module, device) as c: ...`` then ``c.seconds`` and ``c.calls``."""

    def __init__(self, module: Any, device: str = "cpu"):
        self.module, self.device = module, device
        self.seconds, self.calls = 0.0, 0
        self._t0 = 0.0
        self._handles: List[Any] = []

    def _pre(self, module, args):
        _sync(self.device)
        self._t0 = time.perf_counter()

    def _post(self, module, args, output):
        _sync(self.device)
        self.seconds += time.perf_counter() - self._t0
        self.calls += 1

    def __enter__(self) -> "HeadClock":
        self._handles = [self.module.register_forward_pre_hook(self._pre),
                         self.module.register_forward_hook(self._post)]
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


# ---- decoding ---------------------------------------------------------------------------------


def _generate(model, input_ids, attention_mask, new_tokens: int, pad_id: int):
    import torch

    with torch.no_grad():
        return model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=new_tokens,
                              min_new_tokens=new_tokens, do_sample=False, pad_token_id=pad_id)


def greedy(model, encoder: qmodels.Encoder, texts: Sequence[str], new_tokens: int,
           device: str = "cpu") -> List[List[int]]:
    """The new token ids of greedy decoding (exactly ``new_tokens``) for each text, all texts in
    one batch (left-padded): the fast way to compare many prompts; :func:`run` decodes at batch 1."""
    enc = encoder.batch(texts)
    ids, mask = enc["input_ids"].to(device), enc["attention_mask"].to(device)
    out = _generate(model, ids, mask, new_tokens, encoder.pad_id)
    return out[:, ids.shape[1]:].tolist()


def _pass(model, encoder: qmodels.Encoder, rows: List[Dict[str, Any]], new_tokens: int, device: str,
          log) -> Dict[str, Any]:
    """Decodes every prompt at batch 1 with the model as it is; the token ids, texts and timings."""
    import torch

    head = model.get_output_embeddings()
    encoded = [encoder.encode(r["text"]) for r in rows]
    first = torch.tensor([encoded[0]], device=device)
    _generate(model, first, torch.ones_like(first), WARMUP_TOKENS, encoder.pad_id)  # warm-up, untimed
    tokens, seconds = [], []
    with HeadClock(head, device) as clock:
        for r, ids in zip(rows, encoded):
            x = torch.tensor([ids], device=device)
            _sync(device)
            t = time.perf_counter()
            out = _generate(model, x, torch.ones_like(x), new_tokens, encoder.pad_id)
            _sync(device)
            seconds.append(time.perf_counter() - t)
            tokens.append(out[0, len(ids):].tolist())
            if log:
                log(f"  {r['id']}: {len(tokens[-1])} tokens in {seconds[-1]:.2f} s")
    total = sum(seconds)
    n = sum(len(t) for t in tokens)
    return {
        "tokens": tokens,
        "texts": [encoder.decode(t) for t in tokens],
        "prompt_tokens": [len(e) for e in encoded],
        "seconds": [round(s, 4) for s in seconds],
        "total_seconds": round(total, 4),
        "new_tokens": n,
        "tokens_per_s": n / total if total > 0 else None,
        "step_ms": 1e3 * total / n if n else None,
        "head_seconds": round(clock.seconds, 4),
        "head_calls": clock.calls,
        "head_share": clock.seconds / total if total > 0 else None,
        "head_step_ms": 1e3 * clock.seconds / clock.calls if clock.calls else None,
    }


def _head_read_bytes(model) -> Dict[str, Any]:
    """What the head reads per call: the dense weight, or the packed table plus rescored rows."""
    from qhead.torch import QuantLMHead

    h = model.get_output_embeddings()
    if isinstance(h, QuantLMHead):
        t = h.table
        rows = 0
        if h.rescore:
            d = h._dense()
            rows = h.rescore * t.hidden * d.element_size()
        return {"scheme": t.scheme, "rescore": h.rescore, "table_bytes": t.nbytes, "rescore_bytes": rows,
                "bytes": t.nbytes + rows}
    w = h.weight
    n = w.numel() * w.element_size()
    return {"scheme": f"dense {str(w.dtype).replace('torch.', '')}", "rescore": 0, "table_bytes": n,
            "rescore_bytes": 0, "bytes": n}


def _roles(model) -> Dict[str, str]:
    """A short description of each role as the model now has it."""
    from qhead.torch import QuantEmbedding, QuantLMHead

    e, h = model.get_input_embeddings(), model.get_output_embeddings()
    if isinstance(e, QuantEmbedding):
        es = e.table.scheme + (" (gathers the head's full-precision rescoring rows)"
                               if e._dense_rows is not None else "")
    else:
        es = f"dense {str(e.weight.dtype).replace('torch.', '')}"
    if isinstance(h, QuantLMHead):
        hs = h.table.scheme + (f" + rescore {h.rescore} (rows: {h.dense_rows})" if h.rescore else "")
    else:
        hs = f"dense {str(h.weight.dtype).replace('torch.', '')}"
    return {"embedding": es, "head": hs}


def _device_name(device: str) -> str:
    if device.startswith("cuda"):
        import torch

        return f"cuda: {torch.cuda.get_device_name(torch.device(device))}"
    name = qmodels.cpu_name()
    return f"cpu: {name}"


def first_diff(a: Sequence[int], b: Sequence[int]) -> Optional[int]:
    """The index of the first differing token of two sequences (the shorter one's length when one
    is a prefix of the other), None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def run(model_spec: str, head: Optional[str] = "w4g64", embedding: Optional[str] = None, rescore: int = 0,
        prompts: Optional[Sequence[Any]] = None, new_tokens: int = 64, device: str = "cpu",
        dense_rows: str = "cpu", *, threads: int = 0, quantizer: str = "rtn", calibration: Optional[str] = None,
        untie: bool = False, command: Optional[str] = None, log=None) -> Dict[str, Any]:
    """Greedy decoding of every prompt with the dense model, then with its token tables quantized
    (in place: one load); returns the result dict (what ``--json`` writes; see the module doc).

    head / embedding: scheme names, or None / "dense" / "none" to keep the role dense (a tied
    model gets one table: qhead.hf.quantize_model's rules). prompts: strings or corpus Prompts
    (None: the validation prompts). threads > 0 sets torch's and qhead's CPU threads. quantizer,
    calibration (a safetensors file of the head's inputs) and untie: as qhead.hf.quantize_model takes them.
    Raises :class:`ArgumentError` (naming the parameter) for a bad argument or a model that
    cannot be loaded, before loading anything.
    """
    ref, hs, es = _check(model_spec, head, embedding, rescore, new_tokens, device, dense_rows, threads, quantizer,
                         calibration, untie)
    rows = _prompt_rows(prompts)
    import torch
    import transformers

    import qhead.hf as qh

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ArgumentError("device", f"{device}: torch sees no CUDA device")
    if threads > 0:
        torch.set_num_threads(threads)
        qhead.set_num_threads(threads)
    say = log or (lambda s: None)
    t0 = time.perf_counter()
    model, encoder = qmodels.load(ref)
    if device != "cpu":
        model.to(device)
    emb, out = model.get_input_embeddings(), model.get_output_embeddings()
    tied = out.weight is emb.weight
    vocab, hidden = (int(s) for s in out.weight.shape)
    say(f"{ref.name}: loaded in {time.perf_counter() - t0:.1f} s ({vocab} x {hidden}, "
        f"{'tied' if tied else 'untied'}); dense pass")
    dense_bytes = qh.token_table_bytes(model)
    dense_read = _head_read_bytes(model)
    dense_roles = _roles(model)
    dense = _pass(model, encoder, rows, new_tokens, device, log)
    t = time.perf_counter()
    qh.quantize_model(model, head=hs, embedding=es, rescore=rescore, dense_rows=dense_rows, quantizer=quantizer,
                      calibration=calibration, untie=untie)
    quantize_s = time.perf_counter() - t
    del emb, out
    gc.collect()
    say(f"{ref.name}: quantized in {quantize_s:.1f} s; quantized pass")
    quant = _pass(model, encoder, rows, new_tokens, device, log)
    q_bytes = qh.token_table_bytes(model)
    q_read = _head_read_bytes(model)
    for p, b, rd, roles in ((dense, dense_bytes, dense_read, dense_roles),
                            (quant, q_bytes, q_read, _roles(model))):
        p["table_bytes"] = b
        p["head_read_bytes"] = rd["bytes"]
        p["head_read"] = rd
        p["head_gb_per_s"] = (rd["bytes"] / (p["head_step_ms"] * 1e-3) / 1e9) if p["head_step_ms"] else None
        p["roles"] = roles
    prompt_rows = []
    for i, r in enumerate(rows):
        d, q = dense["tokens"][i], quant["tokens"][i]
        prompt_rows.append({**r, "prompt_tokens": dense["prompt_tokens"][i],
                            "dense": {"ids": d, "text": dense["texts"][i], "seconds": dense["seconds"][i]},
                            "quantized": {"ids": q, "text": quant["texts"][i], "seconds": quant["seconds"][i]},
                            "first_diff": first_diff(d, q)})
    for p in (dense, quant):
        for k in ("tokens", "texts", "prompt_tokens", "seconds"):
            del p[k]
    sha = qmodels.file_sha256(ref.path) if os.path.isfile(ref.path) else None
    return {
        "qhead_version": qhead.__version__,
        "qhead_commit": qmodels.source_commit(),
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "model": {"spec": model_spec, "name": ref.name, "kind": ref.kind, "file": os.path.basename(ref.path),
                  "sha256": sha,
                  "vocab": vocab, "hidden": hidden, "tied": tied, "dtype": "float32"},
        "head": hs, "embedding": es, "rescore": rescore, "dense_rows": dense_rows, "quantizer": quantizer,
        "calibration": None if calibration is None else os.path.basename(calibration), "untie": untie,
        "new_tokens": new_tokens, "batch": 1,
        "device": _device_name(device), "device_kind": device,
        "threads": {"torch": torch.get_num_threads(), "qhead": qhead.num_threads()},
        "command": command if command is not None else shlex.join([sys.executable, *sys.argv]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z"),
        "quantize_seconds": round(quantize_s, 3),
        "prompts": prompt_rows,
        "identical": sum(p["first_diff"] is None for p in prompt_rows),
        "dense": dense,
        "quantized": quant,
    }


# ---- the report -------------------------------------------------------------------------------


def _mib(n: Optional[float]) -> str:
    return "-" if n is None else f"{n / 2**20:.1f} MiB"


def _num(x: Optional[float], fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _indent(text: str, pad: str = "      ") -> str:
    return "\n".join(pad + line for line in (text.splitlines() or [""]))


def format_report(result: Dict[str, Any]) -> str:
    """The human-readable report of a :func:`run` result: each prompt with both texts and the
    first differing new token, then the summary."""
    m = result["model"]
    d, q = result["dense"], result["quantized"]
    out = [f"qhead generate: {m['name']} ({m['vocab']} x {m['hidden']}, {'tied' if m['tied'] else 'untied'}), "
           f"{result['new_tokens']} new tokens per prompt, greedy, batch {result.get('batch', 1)}, "
           f"{result['device']}, threads torch {result['threads']['torch']} / qhead {result['threads']['qhead']}",
           f"quantized: embedding {q['roles']['embedding']}; head {q['roles']['head']}", ""]
    for p in result["prompts"]:
        fd = p["first_diff"]
        out.append(f"[{p['id']}] " + ("identical" if fd is None else f"first differing new token: {fd}"))
        out.append("  prompt:")
        out.append(_indent(p["text"]))
        out.append("  dense:")
        out.append(_indent(p["dense"]["text"]))
        out.append("  quantized:")
        out.append(_indent(p["quantized"]["text"]))
        out.append("")
    n = len(result["prompts"])
    out.append(f"prompts identical: {result['identical']}/{n}")
    rows = [("", "dense", "quantized"),
            ("tokens/s", _num(d["tokens_per_s"], ".2f"), _num(q["tokens_per_s"], ".2f")),
            ("step ms", _num(d["step_ms"], ".2f"), _num(q["step_ms"], ".2f")),
            ("head share of generate", _num(d["head_share"], ".1%"), _num(q["head_share"], ".1%")),
            ("head ms per step", _num(d["head_step_ms"], ".3f"), _num(q["head_step_ms"], ".3f")),
            ("head reads per step", _mib(d["head_read_bytes"]), _mib(q["head_read_bytes"])),
            ("head GB/s", _num(d["head_gb_per_s"], ".1f"), _num(q["head_gb_per_s"], ".1f")),
            ("token table memory", _mib(d["table_bytes"]), _mib(q["table_bytes"]))]
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    for a, b, c in rows:
        out.append(f"  {a:<{w0}}  {b:>{w1}}  {c:>12}")
    speed = (d["head_step_ms"] / q["head_step_ms"]) if d["head_step_ms"] and q["head_step_ms"] else None
    less = (d["head_read_bytes"] / q["head_read_bytes"]) if q["head_read_bytes"] else None
    out.append(f"  head: {_num(speed, '.2f')}x faster per step, reading {_num(less, '.2f')}x fewer bytes; "
               f"scheme {result['head'] or result['embedding']}, rescore {result['rescore']}, "
               f"table {'tied (one table for both roles)' if m['tied'] else 'untied'}")
    return "\n".join(out)


# ---- the command line ---------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit status 2)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="qhead generate",
                 description="Greedy generation with a qhead-quantized token table beside the dense model's "
                             "(batch 1): the texts, the first differing new token, tokens/s, the head's share "
                             "of the decode step, the bytes it reads and the table's memory. Also runs as "
                             "python -m qhead.generate.")
    ap.add_argument("--model", required=True, metavar="smollm2|gemma3|PATH.gguf|HF_DIR",
                    help="the model: a known name, a GGUF file or a transformers model directory")
    ap.add_argument("--head", default="w4g64", metavar="SCHEME",
                    help="the head's scheme (w4g64, w8, w4g128a, ...; dense/none keeps it dense; default w4g64)")
    ap.add_argument("--embedding", default=None, metavar="SCHEME",
                    help="the embedding's scheme (default: dense; a tied model has one table: see qhead.hf)")
    ap.add_argument("--quantizer", default="rtn", metavar="rtn|mse|gptq|gptq-mse",
                    help="how the head (a tied model: the table) is quantized (default rtn; gptq and gptq-mse need "
                         "--calibration)")
    ap.add_argument("--calibration", default=None, metavar="STATES.safetensors[:TENSOR]",
                    help="the head's inputs [N, H] (qhead agree --states writes them)")
    ap.add_argument("--untie", action="store_true",
                    help="a tied model gets two tables: the head's (--head, --quantizer) and the embedding's "
                         "(--embedding, or dense)")
    ap.add_argument("--rescore", type=int, default=0, metavar="K",
                    help="rescore the head's top K logits of every step from the full-precision rows (default 0)")
    ap.add_argument("--dense-rows", default="cpu", metavar="cpu|device|FILE",
                    help="where the rescoring rows live: cpu (default), device, or a safetensors file (mapped)")
    ap.add_argument("--prompt", action="append", default=None, metavar="TEXT",
                    help="a prompt (repeatable); default: the corpus's validation prompts")
    ap.add_argument("--validation", action="store_true", help="the corpus's validation prompts (also with --prompt)")
    ap.add_argument("--new-tokens", type=int, default=64, metavar="N", help="new tokens per prompt (default 64)")
    ap.add_argument("--device", default="cpu", metavar="cpu|cuda", help="where the model runs (default cpu)")
    ap.add_argument("--threads", type=int, default=0, metavar="N",
                    help="CPU threads for torch and qhead (default 0: their defaults)")
    ap.add_argument("--json", metavar="OUT.json", help="write every number, the texts and token ids here")
    return ap


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = _parser()
    args = ap.parse_args(argv)
    prompts: Optional[List[Any]] = None
    try:
        if args.prompt:
            prompts = list(args.prompt) + (validation_prompts() if args.validation else [])
        result = run(args.model, head=args.head, embedding=args.embedding, rescore=args.rescore, prompts=prompts,
                     new_tokens=args.new_tokens, device=args.device, dense_rows=args.dense_rows,
                     threads=args.threads, quantizer=args.quantizer, calibration=args.calibration,
                     untie=args.untie, command=shlex.join([sys.executable, "-m", "qhead.generate", *argv]),
                     log=lambda s: print(s, file=sys.stderr, flush=True))
    except ArgumentError as e:
        ap.exit(2, f"{ap.prog}: error: --{e.param}: {e.reason}\n")
    except qhead.Error as e:
        ap.exit(1, f"{ap.prog}: error: {e}\n")
    print(format_report(result), flush=True)
    if args.json:
        import json

        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
