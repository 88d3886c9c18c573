"""qhead.vllm.config: which token tables the vLLM plugin quantizes, and how (no vLLM, no torch).

A :class:`PluginConfig` comes from one of three places:

* nothing (``--quantization qhead`` on a model without a ``quantization_config``): the defaults,
  the head RTN-quantized to ``w4g64`` at load;
* a qhead config, ``{"quant_method": "qhead", "head": "w8", "embedding": None, "rescore": 64, ...}``
  (the model's ``quantization_config``, or ``--hf-overrides '{"quantization_config": {...}}'``);
  the keys are those of ``qhead.hf.QHeadConfig``;
* a compressed-tensors config (``quant_method "compressed-tensors"``, what ``qhead quantize`` and
  llm-compressor write): the token tables its ``config_groups`` select are read packed from the
  checkpoint. Any other module it quantizes is refused (those are vLLM's compressed-tensors
  method's to serve; see :meth:`PluginConfig.check_other_module`).

Each role (``"embedding"``, ``"head"``) then has a scheme (or None: vLLM's own dense layer) and a
source: ``"packed"`` (the checkpoint holds ``weight_packed`` / ``weight_scale`` /
[``weight_zero_point``] / ``weight_shape``) or ``"dense"`` (the checkpoint holds the float
``weight``, RTN-quantized once loaded).

A tied model has one table: :meth:`PluginConfig.tied_role` says what serves both roles.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field, replace  # noqa: F401  (replace: re-exported for callers)
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import qhead
from qhead._safetensors import safetensors_header

__all__ = ["QUANT_METHOD", "RoleSpec", "PluginConfig", "parse_config", "scheme_from_weights_args",
           "packed_roles_in_dir", "EMBEDDING_NAMES", "HEAD_NAMES"]

QUANT_METHOD = "qhead"

# The checkpoint names a role's module has in the model families vLLM loads (transformers'
# names: vLLM's own prefixes follow them, except that some models build the embedding without
# a prefix). A compressed-tensors target selects a role when it names one of these, matches one
# (a "re:" pattern), or names the role's class.
EMBEDDING_NAMES = ("model.embed_tokens", "embed_tokens", "model.language_model.embed_tokens",
                   "transformer.wte", "model.embed_in", "gpt_neox.embed_in", "transformer.word_embeddings")
HEAD_NAMES = ("lm_head", "embed_out", "output")
_ROLE_CLASS = {"embedding": "Embedding", "head": "Linear"}

# qhead config keys (qhead.hf.QHeadConfig's): the ones the plugin reads, and the ones
# QHeadConfig.save_pretrained records about a quantized model that the plugin re-derives.
_QHEAD_KEYS = {"quant_method", "head", "embedding", "rescore", "dense_rows", "scale_dtype", "threads"}
_QHEAD_RECORDED = {"tied", "exact_embedding"}


@dataclass(frozen=True)
class RoleSpec:
    """One role's table: ``scheme`` (a qhead scheme name, None: the role stays vLLM's dense
    layer) and ``source`` ("packed": read packed from the checkpoint; "dense": RTN at load)."""
    scheme: Optional[str] = None
    source: str = "dense"

    @property
    def quantized(self) -> bool:
        return self.scheme is not None


@dataclass(frozen=True)
class PluginConfig:
    """What the plugin does (see the module docstring).

    rescore: K > 0 makes the head's top-K logits of every row exact, recomputed from the
        full-precision rows (qhead's rescore op); the rows are kept in CPU memory
        (``dense_rows="cpu"``, from a dense checkpoint) or mapped from a safetensors file
        (``dense_rows=PATH``; ``dense_tensor`` names the tensor, default the only [V, H] one).
    scale_dtype: of an RTN-quantized table ("f16" / "bf16" / "f32"; None: the weight's dtype).
    """
    embedding: RoleSpec = field(default_factory=RoleSpec)
    head: RoleSpec = field(default_factory=lambda: RoleSpec("w4g64", "dense"))
    rescore: int = 0
    dense_rows: Optional[str] = "cpu"
    dense_tensor: Optional[str] = None
    scale_dtype: Optional[str] = None
    threads: int = 0
    source: str = "default"  # "default" | "qhead" | "compressed-tensors"
    # compressed-tensors: every (targets, scheme) group and the ignore list, to refuse other
    # quantized modules.
    groups: Tuple[Tuple[Tuple[str, ...], str], ...] = ()
    ignore: Tuple[str, ...] = ()
    # The roles the checkpoint stores packed (found in its files), quantized or not by the config.
    packed_roles: Tuple[str, ...] = ()

    def role(self, name: str) -> RoleSpec:
        if name not in ("embedding", "head"):
            raise qhead.InvalidArgumentError(f"qhead.vllm: role must be 'embedding' or 'head', got {name!r}")
        return self.embedding if name == "embedding" else self.head

    def tied_role(self) -> RoleSpec:
        """The one table of a tied model: the head's scheme, else the embedding's (hf.QHeadConfig's
        rule); a packed source wins (the checkpoint stores the table once, packed). Two different
        schemes are an error."""
        e, h = self.embedding, self.head
        if e.quantized and h.quantized and e.scheme != h.scheme:
            raise qhead.InvalidArgumentError(
                f"qhead.vllm: the model's embedding and head are tied (one table) but the config gives them two "
                f"schemes, embedding {e.scheme} and head {h.scheme}")
        scheme = h.scheme or e.scheme
        packed = self.packed_roles or tuple(r for r, s in (("embedding", e), ("head", h))
                                            if s.quantized and s.source == "packed")
        return RoleSpec(scheme, "packed" if packed else "dense")

    def exact_embedding(self, tied: bool) -> bool:
        """A tied model whose head rescores and whose embedding was given no scheme of its own reads
        its embedding from the full-precision rows the head keeps for rescoring (exact, no extra
        memory); the packed table serves the head."""
        return bool(tied and self.rescore > 0 and not self.embedding.quantized and self.head.quantized)

    def check_other_module(self, name: str, cls: str, shard_names: Sequence[str] = ()) -> None:
        """Raises qhead.UnsupportedError when a compressed-tensors group quantizes module `name`
        (of class `cls`; a fused module checks each of `shard_names`, its checkpoint modules): the
        plugin serves the token tables only."""
        if self.source != "compressed-tensors":
            return
        for n in (list(shard_names) or [name]):
            if any(_target_matches(t, n, cls) for t in self.ignore):
                continue
            for targets, scheme in self.groups:
                hit = next((t for t in targets if _target_matches(t, n, cls)), None)
                if hit is not None:
                    raise qhead.UnsupportedError(
                        f"qhead.vllm: the checkpoint's quantization_config quantizes {n} ({cls}, target {hit!r}, "
                        f"{scheme}); the qhead plugin serves checkpoints whose only quantized modules are the token "
                        f"tables (serve this one with --quantization compressed-tensors)")

    def to_dict(self) -> Dict[str, Any]:
        return {"quant_method": QUANT_METHOD, "embedding": self.embedding.scheme, "head": self.head.scheme,
                "embedding_source": self.embedding.source, "head_source": self.head.source,
                "rescore": self.rescore, "dense_rows": self.dense_rows, "scale_dtype": self.scale_dtype,
                "source": self.source}


def _target_matches(target: str, name: str, cls: str) -> bool:
    """compressed-tensors' match: an exact module name, a "re:" pattern matched from the start of
    the name (Python re.match), or the module's class name."""
    if target.startswith("re:"):
        try:
            return re.match(target[3:], name) is not None
        except re.error as e:
            raise qhead.InvalidArgumentError(f"qhead.vllm: quantization_config target {target!r} is not a valid "
                                             f"regular expression ({e})") from None
    return target == name or target == cls or target == "Module"


def _selects_role(target: str, role: str) -> bool:
    names = EMBEDDING_NAMES if role == "embedding" else HEAD_NAMES
    if target == _ROLE_CLASS[role]:
        return True
    if target.startswith("re:"):
        return any(_target_matches(target, n, "") for n in names)
    return target in names


def scheme_from_weights_args(w: Mapping[str, Any], where: str) -> str:
    """The qhead scheme name of a compressed-tensors ``weights`` entry (int, symmetric or not,
    per group or per channel)."""
    if not isinstance(w, Mapping):
        raise qhead.InvalidArgumentError(f"{where}: weights must be an object, got {type(w).__name__}")
    if w.get("type", "int") != "int":
        raise qhead.UnsupportedError(f"{where}: weights type {w.get('type')!r}; qhead reads int weights only")
    if w.get("dynamic"):
        raise qhead.UnsupportedError(f"{where}: dynamic weight quantization is not a stored table")
    if w.get("actorder") not in (None, False, "static", "weight"):
        raise qhead.UnsupportedError(f"{where}: actorder {w.get('actorder')!r} (a g_idx order) is not read by "
                                     "the vLLM plugin")
    bits = w.get("num_bits")
    if not isinstance(bits, int):
        raise qhead.InvalidArgumentError(f"{where}: num_bits must be an integer, got {bits!r}")
    strategy = w.get("strategy")
    name = f"w{bits}"
    if strategy == "group":
        gs = w.get("group_size")
        if not isinstance(gs, int) or gs < 1:
            raise qhead.InvalidArgumentError(f"{where}: strategy 'group' needs a positive group_size, got {gs!r}")
        name += f"g{gs}"
    elif strategy != "channel":
        raise qhead.UnsupportedError(f"{where}: strategy {strategy!r}; qhead reads 'group' and 'channel' tables")
    if not w.get("symmetric", True):
        name += "a"
    qhead.Scheme(name)  # InvalidArgumentError when qhead has no such scheme
    return name


def _parse_compressed_tensors(d: Mapping[str, Any]) -> PluginConfig:
    where = "qhead.vllm: quantization_config"
    groups_in = d.get("config_groups") or {}
    if not isinstance(groups_in, Mapping):
        raise qhead.InvalidArgumentError(f"{where}.config_groups must be an object")
    fmt = d.get("format", "pack-quantized")
    ignore = tuple(str(t) for t in (d.get("ignore") or ()))
    groups: List[Tuple[Tuple[str, ...], str]] = []
    roles: Dict[str, RoleSpec] = {}
    for gname, g in groups_in.items():
        gw = f"{where}.config_groups.{gname}"
        if not isinstance(g, Mapping) or not isinstance(g.get("targets"), list):
            raise qhead.InvalidArgumentError(f"{gw}.targets is missing or not a list")
        targets = tuple(str(t) for t in g["targets"])
        if g.get("input_activations") or g.get("output_activations"):
            raise qhead.UnsupportedError(f"{gw} quantizes activations; qhead's tables are weight-only")
        gfmt = g.get("format") or fmt
        scheme = scheme_from_weights_args(g.get("weights"), f"{gw}.weights")
        others = []
        for t in targets:
            hit = False
            for role in ("embedding", "head"):
                if _selects_role(t, role) and not _role_ignored(role, ignore):
                    if gfmt != "pack-quantized":
                        raise qhead.UnsupportedError(
                            f"{gw}: format {gfmt!r} for the {role}; qhead reads 'pack-quantized' tables")
                    prev = roles.get(role)
                    if prev is not None and prev.scheme != scheme:
                        raise qhead.InvalidArgumentError(
                            f"{gw}: the {role} is selected by two groups with different schemes "
                            f"({prev.scheme}, {scheme})")
                    roles[role] = RoleSpec(scheme, "packed")
                    hit = True
            # A class "Linear"/"Module" or a regex may select the decoder's Linears as well.
            if not hit or t in ("Linear", "Module") or t.startswith("re:"):
                others.append(t)
        if others:
            groups.append((tuple(others), scheme))
    if not roles:
        raise qhead.InvalidArgumentError(
            f"{where}: no config group selects the embedding or the head (targets "
            f"{[t for g in groups for t in g[0]]}); nothing for qhead to serve")
    return PluginConfig(embedding=roles.get("embedding", RoleSpec()), head=roles.get("head", RoleSpec()),
                        source="compressed-tensors", groups=tuple(groups), ignore=ignore)


def _role_ignored(role: str, ignore: Iterable[str]) -> bool:
    names = EMBEDDING_NAMES if role == "embedding" else HEAD_NAMES
    return any(i in names or (i.startswith("re:") and any(_target_matches(i, n, "") for n in names))
               for i in ignore)


def _parse_qhead(d: Mapping[str, Any]) -> PluginConfig:
    unknown = sorted(set(d) - _QHEAD_KEYS - _QHEAD_RECORDED)
    if unknown:
        raise qhead.InvalidArgumentError(
            f"qhead.vllm: unknown qhead config keys {unknown}; known: {sorted(_QHEAD_KEYS - {'quant_method'})}")
    head, emb = d.get("head", "w4g64"), d.get("embedding")
    for role, s in (("head", head), ("embedding", emb)):
        if s is not None:
            if not isinstance(s, str):
                raise qhead.InvalidArgumentError(f"qhead.vllm: {role} must be a scheme name or None, got {s!r}")
            qhead.Scheme(s)
    if head is None and emb is None:
        raise qhead.InvalidArgumentError("qhead.vllm: head and embedding are both None: nothing to quantize")
    try:
        rescore = int(d.get("rescore", 0) or 0)
        threads = int(d.get("threads", 0) or 0)
    except (TypeError, ValueError):
        raise qhead.InvalidArgumentError(
            f"qhead.vllm: rescore / threads must be integers, got {d.get('rescore')!r} / {d.get('threads')!r}") from None
    if rescore < 0:
        raise qhead.InvalidArgumentError(f"qhead.vllm: rescore = {rescore} must be >= 0")
    if rescore and head is None:
        raise qhead.InvalidArgumentError("qhead.vllm: rescore applies to a quantized head; head is None")
    dense_rows = d.get("dense_rows", "cpu")
    if dense_rows == "device":  # hf.QHeadConfig's other in-memory place: vLLM keeps the rows where it loaded them
        dense_rows = "cpu"
    if rescore and dense_rows is None:
        raise qhead.InvalidArgumentError(f"qhead.vllm: rescore = {rescore} needs dense_rows ('cpu' or a safetensors path)")
    sd = d.get("scale_dtype")
    if sd not in (None, "f16", "bf16", "f32"):
        raise qhead.InvalidArgumentError(f"qhead.vllm: scale_dtype must be 'f16', 'bf16', 'f32' or None, got {sd!r}")
    return PluginConfig(embedding=RoleSpec(emb, "dense"), head=RoleSpec(head, "dense"), rescore=rescore,
                        dense_rows=None if dense_rows is None else os.fspath(dense_rows), scale_dtype=sd,
                        threads=threads, source="qhead")


def parse_config(d: Optional[Mapping[str, Any]]) -> PluginConfig:
    """A PluginConfig from a model's quantization_config (or the plugin's own CLI/override dict);
    None or {} gives the defaults."""
    if not d:
        return PluginConfig()
    if not isinstance(d, Mapping):
        raise qhead.InvalidArgumentError(f"qhead.vllm: quantization_config must be an object, got {type(d).__name__}")
    method = d.get("quant_method", QUANT_METHOD)
    if method == QUANT_METHOD:
        return _parse_qhead(d)
    if method == "compressed-tensors":
        return _parse_compressed_tensors(d)
    raise qhead.UnsupportedError(
        f"qhead.vllm: quantization_config quant_method {method!r}; the qhead plugin reads 'qhead' and "
        "'compressed-tensors' (token tables) configs")


# ---- which roles a checkpoint stores packed ---------------------------------------------------------

def _safetensors_names(path: str) -> List[str]:
    header, _ = safetensors_header(path)
    return [k for k in header if k != "__metadata__"]


def checkpoint_tensor_names(model_dir: str) -> List[str]:
    """The tensor names of a model directory's safetensors checkpoint (through its index when
    sharded); [] when the directory has no safetensors files."""
    model_dir = os.fspath(model_dir)
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.isfile(index):
        try:
            with open(index) as f:
                wm = json.load(f).get("weight_map", {})
        except (OSError, ValueError) as e:
            raise qhead.InvalidFileError(f"{index}: cannot read the weight map ({e})") from e
        return list(wm)
    names: List[str] = []
    if os.path.isdir(model_dir):
        for fn in sorted(os.listdir(model_dir)):
            if fn.endswith(".safetensors"):
                names += _safetensors_names(os.path.join(model_dir, fn))
    return names


def packed_roles_in_dir(model_dir: str) -> Dict[str, str]:
    """{role: module name} of the roles a checkpoint stores in the packed layout
    (``<module>.weight_packed``), e.g. what ``qhead.hf`` save_pretrained writes."""
    found: Dict[str, str] = {}
    for n in checkpoint_tensor_names(model_dir):
        if not n.endswith(".weight_packed"):
            continue
        mod = n[: -len(".weight_packed")]
        for role, names in (("embedding", EMBEDDING_NAMES), ("head", HEAD_NAMES)):
            if mod in names:
                found[role] = mod
    return found


def with_checkpoint(cfg: PluginConfig, model_dir: Optional[str]) -> PluginConfig:
    """A qhead config whose roles the checkpoint already stores packed reads them packed (their
    scheme from the file's shapes is checked when the weights load)."""
    if cfg.source == "compressed-tensors" or not model_dir or not os.path.isdir(os.fspath(model_dir)):
        return cfg
    packed = packed_roles_in_dir(model_dir)
    emb, head = cfg.embedding, cfg.head
    if "embedding" in packed and emb.quantized:
        emb = replace(emb, source="packed")
    if "head" in packed and head.quantized:
        head = replace(head, source="packed")
    return replace(cfg, embedding=emb, head=head, packed_roles=tuple(sorted(packed)))
