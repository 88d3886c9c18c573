"""The vLLM side of qhead.vllm: the "qhead" QuantizationConfig and its token-table method.

Imported by :func:`qhead.vllm.register` (vLLM's ``vllm.general_plugins`` entry point); importing
it registers the config with ``register_quantization_config("qhead")``. Everything it decides is
in qhead.vllm.config and qhead.vllm.table (tested without vLLM); this module only maps vLLM's
layers and hooks onto them.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch
from torch import nn

import qhead
from vllm.model_executor.layers.quantization import register_quantization_config
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig, QuantizeMethodBase
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

from . import table as _table
from .config import QUANT_METHOD, PluginConfig, RoleSpec, parse_config, with_checkpoint


from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod


@register_quantization_config(QUANT_METHOD)
class QHeadQuantConfig(QuantizationConfig):
    """``--quantization qhead``: the token tables (embedding / lm_head) served by qhead; every other
    layer is vLLM's own. See docs/vllm.md."""

    def __init__(self, plugin: Optional[PluginConfig] = None):
        super().__init__()
        self.plugin = plugin if plugin is not None else PluginConfig()
        self.tied: Optional[bool] = None

    def __repr__(self) -> str:
        return f"QHeadQuantConfig({self.plugin.to_dict()}, tied={self.tied})"

    def get_name(self) -> str:
        return QUANT_METHOD

    def get_supported_act_dtypes(self) -> List[torch.dtype]:
        return [torch.float32, torch.float16, torch.bfloat16]

    @classmethod
    def get_min_capability(cls) -> int:
        return 70  # qhead's CUDA kernels build for sm_70 and newer; CPU platforms report no capability

    @staticmethod
    def get_config_filenames() -> List[str]:
        return []  # no file of its own: the model's quantization_config, or the defaults

    @classmethod
    def from_config(cls, config: Dict[str, Any]) -> "QHeadQuantConfig":
        d = {k: v for k, v in dict(config).items() if k not in ("total_num_heads", "total_num_kv_heads")}
        return cls(parse_config(d))

    @classmethod
    def from_config_dict_json(cls, text: str) -> "QHeadQuantConfig":
        import json
        return cls.from_config(json.loads(text))

    @classmethod
    def override_quantization_method(cls, hf_quant_cfg, user_quant, hf_config=None):
        # `--quantization qhead` on a compressed-tensors checkpoint of token tables (qhead quantize).
        if user_quant == QUANT_METHOD and isinstance(hf_quant_cfg, dict) and \
                hf_quant_cfg.get("quant_method") in ("compressed-tensors", QUANT_METHOD):
            return QUANT_METHOD
        return None

    def maybe_update_config(self, model_name: str, hf_config=None, revision=None):
        cfg = hf_config.get_text_config() if hf_config is not None and hasattr(hf_config, "get_text_config") \
            else hf_config
        if cfg is not None:
            self.tied = bool(getattr(cfg, "tie_word_embeddings", False))
        self.plugin = with_checkpoint(self.plugin, model_name)

    def _is_tied(self) -> bool:
        if self.tied is None:
            try:
                from vllm.config import get_current_vllm_config
                hf = get_current_vllm_config().model_config.hf_config
                hf = hf.get_text_config() if hasattr(hf, "get_text_config") else hf
                self.tied = bool(getattr(hf, "tie_word_embeddings", False))
            except Exception:  # no current config (a unit use): untied
                self.tied = False
        return self.tied

    def get_quant_method(self, layer: nn.Module, prefix: str) -> Optional[QuantizeMethodBase]:
        if isinstance(layer, ParallelLMHead):
            role = "head"
        elif isinstance(layer, VocabParallelEmbedding):
            role = "embedding"
        else:
            if isinstance(layer, LinearBase):  # vLLM's own dense Linear (a Linear layer must get a method)
                last = prefix.rsplit(".", 1)[-1]
                shards = [prefix[: len(prefix) - len(last)] + s for s in self.packed_modules_mapping.get(last, [])]
                self.plugin.check_other_module(prefix, "Linear", shards)
                return UnquantizedLinearMethod()
            return None
        tied = self._is_tied()
        spec = self.plugin.tied_role() if tied else self.plugin.role(role)
        if spec.scheme is None:
            return None
        return QHeadTableMethod(self, spec, role, tied)


class QHeadTableMethod(QuantizeMethodBase):
    """One token table (an embedding, a head, or the one table of both): packed Parameters in,
    qhead's embed / logits / top-k + rescore ops out."""

    def __init__(self, config: QHeadQuantConfig, spec: RoleSpec, role: str, tied: bool):
        self.config, self.spec, self.role, self.tied = config, spec, role, tied

    def create_weights(self, layer: nn.Module, input_size_per_partition: int, output_partition_sizes: List[int],
                       input_size: int, output_size: int, params_dtype: torch.dtype, **extra_weight_attrs):
        if getattr(layer, "num_added_embeddings", 0):
            raise qhead.UnsupportedError("qhead.vllm: added (LoRA) vocabulary rows are not served by qhead")
        si = layer.shard_indices
        layer.__dict__["_qhead_where"] = f"{layer.prefix or self.role}"
        _table.create_table_weights(
            layer, self.spec, rows=sum(output_partition_sizes), hidden=input_size_per_partition,
            vocab=layer.org_vocab_size, row_range=(si.org_vocab_start_index, si.org_vocab_end_index),
            params_dtype=params_dtype, scale_dtype=self.config.plugin.scale_dtype,
            where=layer.__dict__["_qhead_where"])

    def tie_weights(self, layer: nn.Module, embed_tokens: nn.Module):
        if not isinstance(getattr(embed_tokens, "quant_method", None), QHeadTableMethod):
            raise qhead.UnsupportedError(
                "qhead.vllm: the head is tied to an embedding qhead does not serve; give both roles one scheme")
        _table.tie_tables(layer, embed_tokens)
        return layer

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        _table.finish_table(layer, self.spec, self.config.plugin, role=self.role, rows=layer.num_embeddings_per_partition,
                            vocab=layer.org_vocab_size, hidden=layer.embedding_dim, out_dtype=layer.params_dtype,
                            tied=self.tied, where=layer.__dict__.get("_qhead_where", self.role))

    def embedding(self, layer: nn.Module, input_: torch.Tensor) -> torch.Tensor:
        return _table.state_of(layer).embedding(input_)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        return _table.state_of(layer).logits(x, bias)
