"""The exact one-word substitution on a real review against a brute-force loop through the full forward.

Every admissible vocabulary word at one position, per map, side by side in one run.

The review is the first bundled IMDb review of at least n WordPiece tokens (MiniLM layer-0 embeddings, rows rescaled
to norm sqrt(d), as every sweep reads them); the words are the whole bundled MiniLM vocabulary placed at that
position, h_w = LayerNorm(E_w + P_i + T) rescaled to norm sqrt(d), minus the inadmissible ones (special and [unused]
tokens, the original token, the other WordPiece continuation status, a failed tokenizer round trip:
`wslight.data.vocabulary.EncoderWords`). The package side is one `word_substitution`
call in float32 (the working dtype a sweep uses) on one thread; the brute force runs the map's full forward on every
moved sample, `--brute-words` words in batches of 64, and its time is scaled to the whole vocabulary (marked "est.").
The last column checks the two sides' best word on the brute force's subset.

    python -m benchmarks.words                        # d = 384, n = 64, position 1, the attention maps and RF
    python -m benchmarks.words --maps raf --n 16 64 256
"""

from __future__ import annotations

import argparse
import time

import torch

from wslight.data import EmbeddingSpec, load_token_embeddings  # type: ignore[attr-defined]
from wslight.data.vocabulary import EncoderWords
from wslight.features import make_map
from wslight.search.substitution import word_substitution

MAPS = ["rf", "raf", "relu_raf", "raf_mh12", "linear_raf", "sigmoid_raf", "transformer", "pretrained_attn"]


def review(n: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first bundled review with at least n tokens: X (n, d) rows of norm sqrt(d), and its token ids."""
    emb = load_token_embeddings(EmbeddingSpec(num_samples=200))
    for idx in range(len(emb)):
        ids = emb.input_ids([idx])[0]
        if int((ids != 0).sum()) >= n:
            X, _ = emb.samples([idx], n, d)
            return X[0], ids
    raise SystemExit(f"no bundled review has {n} tokens")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--maps", nargs="+", default=MAPS)
    p.add_argument("--n", type=int, nargs="+", default=[64])
    p.add_argument("--position", type=int, default=1)
    p.add_argument("--brute-words", type=int, default=256, help="words the brute force runs (its time is scaled)")
    p.add_argument("--rf-k", type=int, default=4096, help="RF's width (k = D = n d would not fit at n = 64)")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    words = EncoderWords("bundled-minilm")
    d = words.model.config.hidden_size
    rows = words.rows(a.position, d)  # (V, d), as a review's rows
    print(f"torch {torch.__version__}, 1 thread, d = {d}, position {a.position}, float32, a bundled review\n")
    cols = ["map", "n", "admissible words", "package s", "brute force s", "ratio", "S_words", "best word"]
    cols += ["distance / sqrt(d)", "same best word on the subset"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for n in a.n:
        X, ids = review(n, d)
        ok, _ = words.admissible(ids, a.position)  # (V,): the vocabulary's rules and the tokenizer's round trip
        for name in a.maps:
            extra = {"width_ratio": a.rf_k / (n * d)} if name == "rf" else {}
            m = make_map(name, n, d, seed=0, **extra)
            t0 = time.perf_counter()
            res = word_substitution(m, X[None], [a.position], rows, ok[None, None], dtype="float32")
            sec = time.perf_counter() - t0
            sub = ok.nonzero()[:, 0][: a.brute_words]
            t0 = time.perf_counter()
            with torch.no_grad():
                phi0 = m(X[None])
                rel = []
                for s in range(0, len(sub), 64):
                    Xp = X[None].repeat(len(sub[s : s + 64]), 1, 1)
                    Xp[:, a.position] = rows[sub[s : s + 64]]
                    rel.append((m(Xp) - phi0).norm(dim=-1) / phi0.norm())
            brute = (time.perf_counter() - t0) * int(ok.sum()) / len(sub)
            mask = torch.zeros_like(ok)
            mask[sub] = True
            check = word_substitution(m, X[None], [a.position], rows, mask[None, None], dtype="float32")
            same = int(check.word[0, 0]) == int(sub[torch.cat(rel).argmax()])
            word = words.text(int(res.word[0, 0]))
            row = [name, n, int(ok.sum()), f"{sec:.2f}", f"{brute:.1f} (est.)", f"{brute / sec:.0f}x"]
            row += [f"{float(res.ws[0, 0]):.3f}", word, f"{float(res.distance[0, 0]):.2f}", "yes" if same else "NO"]
            print("| " + " | ".join(str(c) for c in row) + " |", flush=True)


if __name__ == "__main__":
    main()
