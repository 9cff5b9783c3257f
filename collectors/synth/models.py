"""Transformer model descriptions: the built-in zoo (``models/*.toml``) and user model files.

A model is a dense decoder-only transformer given by its dimensions. The zoo files are plain
TOML, one table per model; a user file (``--model-file``) holds the keys of one table at top
level (``hidden``, ``ffn``, ``heads``, ``kv_heads`` optional, ``layers``, ``seq``, ``vocab``)
or a single named table. JSON files with the same keys work too.
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

    def __post_init__(self) -> None:
        for f in ("hidden", "ffn", "heads", "layers", "seq", "vocab"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ConfigError(f"model {self.name!r}: {f}={v!r} must be a positive integer")
        if self.kv_heads == 0:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.hidden % self.heads:
            raise ConfigError(f"model {self.name!r}: heads={self.heads} must divide "
                              f"hidden={self.hidden}")
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
        if self.experts != 1:
            raise ConfigError(f"model {self.name!r}: experts={self.experts}: mixture-of-experts "
                              "models are not modeled yet; give a dense model (experts = 1)")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        """Width of K (and of V): ``kv_heads * head_dim``."""
        return self.kv_heads * self.head_dim

    def layer_params(self) -> int:
        """Parameters of one transformer layer (weights + biases + norms)."""
        h, f = self.hidden, self.ffn
        qkv = h * (h + 2 * self.kv_dim)
        proj = h * h
        mlp = h * f * (3 if self.gated_mlp else 2)
        if self.norm == "layernorm":  # GPT style: biases and LayerNorm gain + bias
            extra = (h + 2 * self.kv_dim) + h + f + h + 4 * h
        else:  # Llama style: no biases, RMSNorm gain only
            extra = 2 * h
        return qkv + proj + mlp + extra

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
        """Total parameter count."""
        return self.layers * self.layer_params() + self.embedding_params()

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
