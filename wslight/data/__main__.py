"""Build the embedding cache ahead of time and print its manifest.

    python -m wslight.data build [--source imdb_offline] [--encoder bundled-minilm] [--num-samples 1000] ...

Prints the manifest (JSON), then one line `cache: <path> (<built|hit> in <s> s, <reviews/s> reviews/s)`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import fields

from wslight.data.build import load_token_embeddings
from wslight.data.sources import SELECTIONS, SOURCES
from wslight.data.spec import STORAGE_DTYPES, EmbeddingSpec


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m wslight.data", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="build (or validate) the embedding cache and print its manifest")
    defaults = {f.name: f.default for f in fields(EmbeddingSpec)}
    b.add_argument("--source", choices=SOURCES, default=defaults["source"])
    b.add_argument("--encoder", default=defaults["encoder"], help="bundled-minilm, bert-base-uncased or a folder")
    b.add_argument("--layer", type=int, default=defaults["layer"], help="0 = embedding layer output (the paper's)")
    b.add_argument("--max-length", type=int, default=defaults["max_length"])
    b.add_argument("--max-tokens", type=int, default=defaults["max_tokens"])
    b.add_argument("--num-samples", type=int, default=defaults["num_samples"], help="even; balanced +1/-1")
    b.add_argument("--seed", type=int, default=defaults["seed"])
    b.add_argument(
        "--cache-dir", default=None, help="default $WSLIGHT_CACHE, else $XDG_CACHE_HOME/wslight or ~/.cache/wslight"
    )
    b.add_argument("--synthetic-dim", type=int, default=defaults["synthetic_dim"])
    b.add_argument("--selection", choices=SELECTIONS, default=defaults["selection"])
    b.add_argument("--storage-dtype", choices=list(STORAGE_DTYPES), default=defaults["storage_dtype"])
    b.add_argument("--batch-size", type=int, default=defaults["batch_size"], help="reviews per encoder batch")
    b.add_argument("--device", default=None, help="encoder device (default cuda if available, else cpu)")
    b.add_argument("--verify", choices=("full", "size"), default="full", help="check the file's sha256 or only size")
    b.add_argument("--no-progress", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Build the cache the arguments describe and print its manifest and a one-line summary; returns the exit status."""
    a = _parser().parse_args(argv)
    spec = EmbeddingSpec(
        source=a.source,
        encoder=a.encoder,
        layer=a.layer,
        max_length=a.max_length,
        max_tokens=a.max_tokens,
        num_samples=a.num_samples,
        seed=a.seed,
        cache_dir=a.cache_dir,
        synthetic_dim=a.synthetic_dim,
        selection=a.selection,
        storage_dtype=a.storage_dtype,
        batch_size=a.batch_size,
    )
    t0 = time.perf_counter()
    emb = load_token_embeddings(spec, progress=not a.no_progress, verify=a.verify, device=a.device)
    dt = time.perf_counter() - t0
    print(json.dumps(emb.manifest, indent=2))
    where = emb.path if emb.path is not None else "(synthetic, generated on demand)"
    print(f"cache: {where} ({'built' if emb.built else 'hit'} in {dt:.3f} s, {len(emb) / max(dt, 1e-9):.1f} reviews/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
