"""Transformer model descriptions: the built-in zoo (``models/*.toml``) and user model files.

A model is a decoder-only transformer given by its dimensions: dense, or mixture of experts
(``experts`` routed experts of ``expert_ffn`` each, ``top_k`` per token, ``shared_experts``
always on, the first ``dense_layers`` layers dense with ``ffn``), with multi-head,
grouped-query or DeepSeek's multi-head latent attention (``q_lora_rank``, ``kv_lora_rank``:
low-rank Q and compressed KV projections). The zoo files are plain TOML, one table per model;
a user file (``--model-file``) holds the keys of one table at top level (``hidden``, ``ffn``,
``heads``, ``kv_heads`` optional, ``layers``, ``seq``, ``vocab``, and the MoE / MLA keys) or
a single named table. JSON files with the same keys work too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from functools import lru_cache
from pathlib import Path
from typing import Any

import tomllib

from ..errors import ConfigError

__all__ = ["ModelConfig", "model_names", "load_model", "read_model_file", "resolve_model"]

_ZOO_DIR = Path(__file__).with_name("models")


@dataclass(frozen=True)
class ModelConfig:
    """Dimensions of a dense decoder-only transformer.

    ``ffn`` is the MLP inner size; ``gated_mlp`` (SwiGLU) uses three ``hidden x ffn``
    matrices instead of two. ``kv_heads`` < ``heads`` is grouped-query attention.
    ``attention`` is the kernel family: ``"unfused"`` materializes the ``s x s`` scores
    (Megatron-LM 2022 era), ``"flash"`` is a fused causal flash attention.

    Mixture of experts (``experts > 1``): every layer after the first ``dense_layers`` routes
    each token to ``top_k`` of ``experts`` gated MLPs of inner size ``expert_ffn`` (``ffn``
    when 0) plus ``shared_experts`` always-on ones; a linear router scores the experts.
    ``route_nodes`` > 0 is DeepSeek's node-limited routing: a token reaches at most that many
    nodes and crosses the network once per node (then fans out over NVLink).

    Multi-head latent attention (``kv_lora_rank > 0``): K and V are rebuilt per head from a
    ``kv_lora_rank`` latent (plus a shared ``qk_rope_dim`` rotary key); ``q_lora_rank > 0``
    makes the query low-rank too. Heads have ``head_dim`` (no-position part) +
    ``qk_rope_dim`` query/key and ``v_head_dim`` value widths. ``mtp_depth`` extra
    multi-token-prediction modules (one transformer layer + shared output head each) run
    after the last layer.
    """

    name: str
    hidden: int
    ffn: int
    heads: int
    layers: int
    seq: int
    vocab: int
    kv_heads: int = 0  # 0 = heads (multi-head attention)
    gated_mlp: bool = False
    norm: str = "layernorm"
    positions: str = "learned"
    tied_embeddings: bool = True
    attention: str = "flash"
    dropout: bool = True
    experts: int = 1
    top_k: int = 1
    expert_ffn: int = 0
    shared_experts: int = 0
    dense_layers: int = 0
    route_nodes: int = 0
    head_dim: int = 0  # 0: hidden / heads
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_dim: int = 0
    v_head_dim: int = 0  # 0: head_dim
    mtp_depth: int = 0

    def __post_init__(self) -> None:
        for f in ("hidden", "ffn", "heads", "layers", "seq", "vocab"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ConfigError(f"model {self.name!r}: {f}={v!r} must be a positive integer")
        for f in ("experts", "top_k"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"model {self.name!r}: {f}={v!r} must be an integer >= 1")
        for f in ("expert_ffn", "shared_experts", "dense_layers", "route_nodes", "head_dim",
                  "q_lora_rank", "kv_lora_rank", "qk_rope_dim", "v_head_dim", "mtp_depth"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ConfigError(f"model {self.name!r}: {f}={v!r} must be an integer >= 0")
        if self.top_k > self.experts:
            raise ConfigError(f"model {self.name!r}: top_k={self.top_k} exceeds "
                              f"experts={self.experts}")
        if self.dense_layers > self.layers:
            raise ConfigError(f"model {self.name!r}: dense_layers={self.dense_layers} exceeds "
                              f"layers={self.layers}")
        if self.expert_ffn == 0:
            object.__setattr__(self, "expert_ffn", self.ffn)
        if self.kv_heads == 0:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.head_dim == 0:
            if self.hidden % self.heads:
                raise ConfigError(f"model {self.name!r}: heads={self.heads} must divide "
                                  f"hidden={self.hidden} (or give head_dim)")
            object.__setattr__(self, "head_dim", self.hidden // self.heads)
        if self.v_head_dim == 0:
            object.__setattr__(self, "v_head_dim", self.head_dim)
        if self.mla and self.kv_heads != self.heads:
            raise ConfigError(f"model {self.name!r}: latent attention (kv_lora_rank) rebuilds "
                              f"K/V per head; kv_heads={self.kv_heads} must equal "
                              f"heads={self.heads}")
        if self.kv_heads <= 0 or self.heads % self.kv_heads:
            raise ConfigError(f"model {self.name!r}: kv_heads={self.kv_heads} must divide "
                              f"heads={self.heads}")
        if self.norm not in ("layernorm", "rmsnorm"):
            raise ConfigError(f"model {self.name!r}: norm={self.norm!r}; use layernorm or rmsnorm")
        if self.positions not in ("learned", "rotary"):
            raise ConfigError(f"model {self.name!r}: positions={self.positions!r}; "
                              "use learned or rotary")
        if self.attention not in ("flash", "unfused"):
            raise ConfigError(f"model {self.name!r}: attention={self.attention!r}; "
                              "use flash or unfused")

    @property
    def moe(self) -> bool:
        return self.experts > 1

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def kv_dim(self) -> int:
        """Width of K (and of V): ``kv_heads * head_dim``."""
        return self.kv_heads * self.head_dim

    @property
    def qk_head_dim(self) -> int:
        """Query / key width per head (MLA: no-position part + rotary part)."""
        return self.head_dim + self.qk_rope_dim

    def is_moe_layer(self, layer: int) -> bool:
        return self.moe and layer >= self.dense_layers

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.moe else 0

    def attention_params(self) -> int:
        """Attention weights of one layer (projections; norms and biases separately)."""
        h, a = self.hidden, self.heads
        if self.mla:
            q = (h * self.q_lora_rank + self.q_lora_rank * a * self.qk_head_dim
                 if self.q_lora_rank else h * a * self.qk_head_dim)
            kv = (h * (self.kv_lora_rank + self.qk_rope_dim)
                  + self.kv_lora_rank * a * (self.head_dim + self.v_head_dim))
            return q + kv + a * self.v_head_dim * h
        return h * (a * self.head_dim + 2 * self.kv_dim) + a * self.head_dim * h

    def mlp_params(self, ffn: int) -> int:
        return self.hidden * ffn * (3 if self.gated_mlp else 2)

    def expert_params(self) -> int:
        """Routed-expert weights of one MoE layer (all experts)."""
        return self.experts * self.mlp_params(self.expert_ffn) if self.moe else 0

    def layer_params(self, layer: int = 0) -> int:
        """Parameters of layer ``layer`` (weights + biases + norms; a MoE layer counts all
        routed experts, the shared ones and the router)."""
        h, f = self.hidden, self.ffn
        if self.is_moe_layer(layer):
            mlp = (self.expert_params() + self.shared_experts * self.mlp_params(self.expert_ffn)
                   + h * self.experts)
        else:
            mlp = self.mlp_params(f)
        if self.norm == "layernorm":  # GPT style: biases and LayerNorm gain + bias
            extra = (h + 2 * self.kv_dim) + h + f + h + 4 * h
        else:  # Llama style: no biases, RMSNorm gain only (MLA: + the latents' norms)
            extra = 2 * h + (self.q_lora_rank + self.kv_lora_rank if self.mla else 0)
        return self.attention_params() + mlp + extra

    def active_layer_params(self, layer: int = 0) -> int:
        """Parameters one token goes through in layer ``layer`` (top-k routed experts)."""
        p = self.layer_params(layer)
        if self.is_moe_layer(layer):
            p -= (self.experts - self.top_k) * self.mlp_params(self.expert_ffn)
        return p

    def embedding_params(self, vocab: int | None = None) -> int:
        """Input embedding (+ learned positions) and, if untied, the output matrix."""
        v = self.vocab if vocab is None else vocab
        p = v * self.hidden
        if self.positions == "learned":
            p += self.seq * self.hidden
        if not self.tied_embeddings:
            p += v * self.hidden
        return p + (2 if self.norm == "layernorm" else 1) * self.hidden  # final norm

    def params(self) -> int:
        """Total parameter count (multi-token-prediction modules included)."""
        return (sum(self.layer_params(i) for i in range(self.layers)) + self.embedding_params()
                + self.mtp_depth * self.mtp_params())

    def active_params(self) -> int:
        """Parameters one token goes through (MoE: top-k routed experts per layer)."""
        return (sum(self.active_layer_params(i) for i in range(self.layers))
                + self.embedding_params() + self.mtp_depth * (
                    self.mtp_params() - self.layer_params(self.layers - 1)
                    + self.active_layer_params(self.layers - 1)))

    def mtp_params(self) -> int:
        """One multi-token-prediction module: a transformer layer (like the last one), the
        projection of [hidden; embedding] (2h -> h) and two norms (head shared)."""
        return self.layer_params(self.layers - 1) + 2 * self.hidden * self.hidden \
            + 2 * self.hidden

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


_KEYS = {f.name for f in fields(ModelConfig)}


def _from_table(name: str, table: dict[str, Any], where: str) -> ModelConfig:
    unknown = sorted(set(table) - _KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown model key(s) {unknown}; allowed: {sorted(_KEYS)}")
    missing = [k for k in ("hidden", "ffn", "heads", "layers", "seq", "vocab") if k not in table]
    if missing:
        raise ConfigError(f"{where}: model {name!r} lacks required key(s) {missing}")
    kw = dict(table)
    kw["name"] = str(kw.get("name", name))
    return ModelConfig(**kw)


@lru_cache(maxsize=1)
def _zoo() -> dict[str, ModelConfig]:
    out: dict[str, ModelConfig] = {}
    for f in sorted(_ZOO_DIR.glob("*.toml")):
        with open(f, "rb") as fh:
            data = tomllib.load(fh)
        for name, table in data.items():
            out[name] = _from_table(name, table, str(f))
    return out


def model_names() -> list[str]:
    """Names of the built-in models."""
    return sorted(_zoo())


def load_model(name: str) -> ModelConfig:
    """A built-in model by name (case-insensitive), e.g. ``"gpt3-175b"``, ``"llama3-70b"``."""
    z = _zoo()
    key = name.lower()
    if key not in z:
        raise ConfigError(f"unknown model {name!r}; built-in models: {', '.join(model_names())}; "
                          "or give a TOML file of dimensions with --model-file")
    return z[key]


def read_model_file(path: str | Path) -> ModelConfig:
    """Read a model from a TOML or JSON file of dimensions (top-level keys or one table)."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read model file ({exc})") from exc
    try:
        data = json.loads(raw) if p.suffix.lower() == ".json" else tomllib.loads(raw.decode())
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: not valid {'JSON' if p.suffix == '.json' else 'TOML'} "
                          f"({exc})") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: expected a table of model dimensions")
    if "hidden" not in data and len(data) == 1 and isinstance(next(iter(data.values())), dict):
        name, table = next(iter(data.items()))
        return _from_table(name, table, str(p))
    return _from_table(p.stem, data, str(p))


def resolve_model(model: str | Path | ModelConfig | dict[str, Any]) -> ModelConfig:
    """A ModelConfig from a zoo name, a file path, a dict of dimensions or a ModelConfig."""
    if isinstance(model, ModelConfig):
        return model
    if isinstance(model, dict):
        return _from_table(str(model.get("name", "custom")), model, "model dict")
    s = str(model)
    if s.endswith((".toml", ".json")) or Path(s).is_file():
        return read_model_file(s)
    return load_model(s)
