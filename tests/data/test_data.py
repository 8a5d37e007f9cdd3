"""Data layer: the offline IMDb source, the encoder's description, the embedding cache, preprocessing and the rest.

The embedding cache (key, hits, rebuilds, atomic writes), preprocessing, synthetic data, the DataModule (nested spec,
splits, DDP sharding, workers), the build command and bad input.
"""

import dataclasses
import json
import pickle
import time

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from wslight.data import (
    CacheRebuildWarning,
    EmbeddingSpec,
    cache_key,
    cache_paths,
    cache_root,
    encoders,
    load_texts,
    load_token_embeddings,
    preprocess,
)
from wslight.data import build as build_mod
from wslight.data.__main__ import main as data_main
from wslight.data.encoders import HubUnreachableError
from wslight.data.sources import TextCorpus
from wslight.data.synthetic import planted_direction, synthetic_labels, synthetic_tokens
from wslight.tasks import EmbeddingDataModule

M = 20


def spec_for(tmp, **kw):
    kw.setdefault("num_samples", 8)
    kw.setdefault("batch_size", 4)
    return EmbeddingSpec(cache_dir=str(tmp), **kw)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("wslight-cache")


@pytest.fixture(scope="module")
def emb(cache_dir):
    """One real offline cache (M reviews), built once for the module."""
    return load_token_embeddings(EmbeddingSpec(num_samples=M, cache_dir=str(cache_dir)), progress=False)


def forbid_encoder(monkeypatch):
    """Make every way to text, tokenizer or encoder raise."""

    def boom(*a, **k):
        raise AssertionError("the encoder / text source must not be used here")

    monkeypatch.setattr(encoders, "load_encoder", boom)
    monkeypatch.setattr(build_mod, "load_texts", boom)
    import transformers

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", boom)


# ---------------------------------------------------------------------------------------------------------- source


def test_offline_source_is_the_real_imdb_train_split():
    corpus = load_texts("imdb_offline")
    assert len(corpus) == 25_000 and corpus.split == "train"
    assert np.bincount(corpus.labels).tolist() == [12_500, 12_500]
    # Stored like the hub's train split: sorted by label, starting with this negative review.
    assert corpus.texts[0].startswith("I rented I AM CURIOUS-YELLOW") and corpus.labels[0] == 0
    assert (np.diff(corpus.labels) >= 0).all()


def test_offline_cache_holds_real_short_balanced_reviews(emb):
    corpus = load_texts("imdb_offline")
    _, tok, info = encoders.load_encoder("bundled-minilm")
    assert len(emb) == M and emb.hidden_size == info.hidden_size == 384 and emb.max_length == 256
    assert emb.labels.dtype == torch.float32 and emb.sample_ids.dtype == torch.int64
    assert emb.labels.sum() == 0 and set(emb.labels.tolist()) == {1.0, -1.0}  # balanced +/-1
    assert len(set(emb.sample_ids.tolist())) == M
    ids = emb.input_ids(slice(None))  # (M, 256)
    for k, sid in enumerate(emb.sample_ids.tolist()):
        text = corpus.texts[sid]
        pieces = tok.tokenize(text)
        assert len(pieces) < 240  # Paper: fewer than 240 WordPiece tokens, specials excluded
        assert emb.labels[k] == (1.0 if corpus.labels[sid] == 1 else -1.0)  # 1 -> +1, 0 -> -1
        # the stored ids are [CLS] review [SEP] [PAD]... of exactly this review
        expected = [tok.cls_token_id, *tok.convert_tokens_to_ids(pieces), tok.sep_token_id]
        assert ids[k, : len(expected)].tolist() == expected
        assert (ids[k, len(expected) :] == tok.pad_token_id).all()
    assert emb.manifest["classes"] == {"+1": M // 2, "-1": M // 2}
    assert emb.manifest["split"] == "train" and emb.manifest["encoder"]["name"] == "bundled-minilm"


def test_selection_is_seeded(cache_dir, emb):
    again = load_token_embeddings(EmbeddingSpec(num_samples=M, cache_dir=str(cache_dir)), progress=False)
    assert torch.equal(again.sample_ids, emb.sample_ids)
    other = load_token_embeddings(EmbeddingSpec(num_samples=M, seed=1, cache_dir=str(cache_dir)), progress=False)
    assert other.path != emb.path and set(other.sample_ids.tolist()) != set(emb.sample_ids.tolist())


def test_layer0_embeddings_equal_hidden_states0_and_cache(emb):
    model, tok, _ = encoders.load_encoder("bundled-minilm")
    corpus = load_texts("imdb_offline")
    texts = [corpus.texts[i] for i in emb.sample_ids[:2].tolist()]
    enc = tok(texts, padding="max_length", truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        h0 = model(**enc, output_hidden_states=True).hidden_states[0]  # (2, 256, 384)
        e = model.embeddings(input_ids=enc["input_ids"], token_type_ids=enc["token_type_ids"])
    torch.testing.assert_close(e, h0, rtol=0, atol=1e-6)
    cached = emb.raw([0, 1]).float()  # float16 storage
    torch.testing.assert_close(cached, h0, rtol=2e-3, atol=2e-3)


def test_deeper_layer_is_that_hidden_state(tmp_path):
    e = load_token_embeddings(spec_for(tmp_path, num_samples=2, layer=2, storage_dtype="float32"), progress=False)
    model, tok, _ = encoders.load_encoder("bundled-minilm")
    texts = [load_texts("imdb_offline").texts[i] for i in e.sample_ids.tolist()]
    enc = tok(texts, padding="max_length", truncation=True, max_length=256, return_tensors="pt")
    with torch.no_grad():
        h2 = model(**enc, output_hidden_states=True).hidden_states[2]
    torch.testing.assert_close(e.raw([0, 1]), h2, rtol=1e-5, atol=1e-5)
    assert e.manifest["layer"] == 2


# ----------------------------------------------------------------------------------------------------------- cache


def test_cache_hit_skips_encoder_and_text(cache_dir, emb, monkeypatch):
    forbid_encoder(monkeypatch)
    t = time.perf_counter()
    hit = load_token_embeddings(EmbeddingSpec(num_samples=M, cache_dir=str(cache_dir)), progress=False)
    assert not hit.built and emb.built
    assert torch.equal(hit.raw(slice(None)), emb.raw(slice(None)))
    assert torch.equal(hit.labels, emb.labels) and torch.equal(hit.sample_ids, emb.sample_ids)
    assert time.perf_counter() - t < emb.manifest["timing"]["total_s"]


def _build_small(tmp_path):
    spec = spec_for(tmp_path)
    first = load_token_embeddings(spec, progress=False)
    data, manifest = cache_paths(spec)
    assert first.path == data and manifest.is_file()
    return spec, first, data, manifest


def _rebuilt(spec, first, match):
    with pytest.warns(CacheRebuildWarning, match=match):
        again = load_token_embeddings(spec, progress=False)
    assert again.built
    assert torch.equal(again.raw(slice(None)), first.raw(slice(None)))
    assert torch.equal(again.sample_ids, first.sample_ids)
    return again


def test_truncated_cache_is_rebuilt_with_a_warning(tmp_path):
    spec, first, data, _ = _build_small(tmp_path)
    raw = data.read_bytes()
    data.write_bytes(raw[: len(raw) - 1000])
    _rebuilt(spec, first, "truncated")
    assert data.read_bytes() == raw


def test_corrupt_bytes_are_detected_by_the_checksum(tmp_path):
    spec, first, data, _ = _build_small(tmp_path)
    raw = bytearray(data.read_bytes())
    raw[-5000] ^= 0xFF  # same size, one flipped byte inside the embeddings
    data.write_bytes(bytes(raw))
    _rebuilt(spec, first, "sha256")


def test_edited_manifest_is_a_mismatch_and_rebuilt(tmp_path):
    spec, first, _, manifest = _build_small(tmp_path)
    m = json.loads(manifest.read_text())
    m["request"]["layer"] = 3
    manifest.write_text(json.dumps(m))
    _rebuilt(spec, first, "does not match")
    assert json.loads(manifest.read_text())["request"]["layer"] == 0


def test_data_without_manifest_is_rebuilt(tmp_path):
    spec, first, _, manifest = _build_small(tmp_path)
    manifest.unlink()
    _rebuilt(spec, first, "without a manifest")


def test_interrupted_build_leaves_no_entry(tmp_path, monkeypatch):
    spec = spec_for(tmp_path)
    real = build_mod._embed_batch
    calls = []

    def dies_on_second_batch(*a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(build_mod, "_embed_batch", dies_on_second_batch)
    with pytest.raises(KeyboardInterrupt):
        load_token_embeddings(spec, progress=False)
    left = [f.name for f in tmp_path.iterdir() if f.suffix != ".lock"]
    assert left == []  # no data file, no manifest, no temporary file
    monkeypatch.setattr(build_mod, "_embed_batch", real)
    with warnings_as_errors():
        assert load_token_embeddings(spec, progress=False).built  # a clean miss: no rebuild warning


class warnings_as_errors:
    def __enter__(self):
        import warnings

        self._cm = warnings.catch_warnings()
        self._cm.__enter__()
        warnings.simplefilter("error", CacheRebuildWarning)

    def __exit__(self, *exc):
        return self._cm.__exit__(*exc)


def test_cache_file_is_standard_safetensors(emb):
    from safetensors import safe_open

    with safe_open(str(emb.path), framework="pt") as f:
        assert torch.equal(f.get_tensor("labels"), emb.labels)
        assert torch.equal(f.get_tensor("sample_ids"), emb.sample_ids)
        assert torch.equal(f.get_tensor("embeddings")[3], emb.raw([3])[0])


def test_cache_dir_from_env(tmp_path, monkeypatch):
    monkeypatch.setenv("WSLIGHT_CACHE", str(tmp_path / "env"))
    assert cache_root(None) == tmp_path / "env"
    assert cache_root(str(tmp_path / "x")) == tmp_path / "x"  # a configured cache_dir wins over the variable
    monkeypatch.delenv("WSLIGHT_CACHE")
    monkeypatch.chdir(tmp_path)  # the default no longer depends on the working directory
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root(None) == tmp_path / "xdg" / "wslight"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root(None) == tmp_path / "home" / ".cache" / "wslight"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # XDG says: ignore a relative path
    assert cache_root(None) == tmp_path / "home" / ".cache" / "wslight"


def test_cache_key_is_stable():
    """The key of an entry derives from the request alone: a pinned value, so entries built before stay hits."""
    spec = EmbeddingSpec(source="synthetic", num_samples=40)
    request = cache_key.cache_request(spec, None)
    assert request == {
        "format": 1,
        "source": "synthetic",
        "source_fingerprint": {"generator": "wslight.data.synthetic"},
        "max_length": 256,
        "num_samples": 40,
        "seed": 0,
        "synthetic_dim": 384,
        "synthetic_unit_rows": False,
    }
    assert cache_key.cache_stem(spec, request) == "synthetic-bundled-minilm-layer0-L256-M40-seed0-d0d76481329fa208"
    text = EmbeddingSpec(num_samples=20, layer=2)
    info = encoders.encoder_info(text.encoder)
    assert set(cache_key.cache_request(text, info)) == {
        "format", "source", "source_fingerprint", "max_length", "num_samples", "seed", "encoder", "encoder_revision",
        "encoder_fingerprint", "layer", "max_tokens", "selection", "storage_dtype", "tokenization",
    }  # fmt: skip
    # cache_dir and the encoder batch are not part of the key
    assert cache_key.cache_request(dataclasses.replace(text, cache_dir="/elsewhere", batch_size=7), info) == (
        cache_key.cache_request(text, info)
    )


def test_one_encoder_description():
    """encoder_info reads config.json without weights; load_encoder returns that same description."""
    info = encoders.encoder_info("bundled-minilm")
    model, _, loaded = encoders.load_encoder("bundled-minilm")
    assert loaded == info
    cfg = model.config
    assert (info.hidden_size, info.num_layers, info.num_heads) == (
        cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads
    ) == (384, 6, 12)  # fmt: skip
    assert info.revision is None and len(info.fingerprint) == 64


def test_pickles_without_the_memory_map(emb):
    blob = pickle.dumps(emb)
    assert len(blob) < 50_000 < emb.path.stat().st_size
    back = pickle.loads(blob)
    assert torch.equal(back.raw([5, 2]), emb.raw([5, 2]))


# ------------------------------------------------------------------------------------------------- preprocessing


def test_preprocess_first_n_d_and_row_norm_sqrt_d(emb):
    n, d = 30, 100
    X, y = emb.samples([4, 0, 7], n, d)
    assert X.shape == (3, n, d) and X.dtype == torch.float32 and torch.equal(y, emb.labels[[4, 0, 7]])
    torch.testing.assert_close(X.norm(dim=-1), torch.full((3, n), d**0.5), rtol=1e-5, atol=1e-5)
    full = emb.raw([4, 0, 7]).float()  # (3, 256, 384)
    block = full[:, :n, :d]
    torch.testing.assert_close(X, block / block.norm(dim=-1, keepdim=True) * d**0.5)
    X_raw, _ = emb.samples([4, 0, 7], n, d, normalize=False)
    assert torch.equal(X_raw, block)
    X64, _ = emb.samples([4], n, d, dtype=torch.float64)
    assert X64.dtype == torch.float64
    torch.testing.assert_close(X64.norm(dim=-1), torch.full((1, n), d**0.5, dtype=torch.float64))


def test_preprocess_function(rows):
    H = 3.0 * rows(2, 12, 16)
    X = preprocess(H, 5, 7)
    assert X.shape == (2, 5, 7)
    torch.testing.assert_close(X.norm(dim=-1), torch.full((2, 5), 7**0.5))
    torch.testing.assert_close(X / X.norm(dim=-1, keepdim=True), H[:, :5, :7] / H[:, :5, :7].norm(dim=-1, keepdim=True))


# ------------------------------------------------------------------------------------------------------- synthetic


def test_synthetic_is_deterministic_balanced_and_planted():
    spec = EmbeddingSpec(source="synthetic", num_samples=10, max_length=6, synthetic_dim=8, seed=3)
    a, b = load_token_embeddings(spec), load_token_embeddings(spec)
    assert a.labels.sum() == 0 and a.hidden_size == 8 and a.max_length == 6
    assert torch.equal(a.samples(slice(None), 6, 8)[0], b.samples(slice(None), 6, 8)[0])
    # random access equals batch access
    assert torch.equal(a.samples([7], 4, 5)[0][0], a.samples(slice(None), 4, 5)[0][7])
    # Paper (docs/theory/checks.md §10.3): y = sign(<flat(X), u>) on the raw Gaussian tokens
    X, y = a.samples(slice(None), 6, 8, normalize=False, dtype=torch.float64)
    assert torch.equal(synthetic_labels(X, planted_direction(3, 6, 8)), y)
    torch.testing.assert_close(X, synthetic_tokens(3, a.sample_ids, 6, 8))
    c = load_token_embeddings(EmbeddingSpec(source="synthetic", num_samples=10, max_length=6, synthetic_dim=8))
    assert not torch.allclose(c.samples([0], 6, 8)[0], a.samples([0], 6, 8)[0])
    Xn, _ = a.samples([0, 1], 6, 8, normalize=True)
    torch.testing.assert_close(Xn.norm(dim=-1), torch.full((2, 6), 8**0.5))


def test_synthetic_unit_rows_option():
    spec = EmbeddingSpec(source="synthetic", num_samples=4, max_length=3, synthetic_dim=5, synthetic_unit_rows=True)
    X, _ = load_token_embeddings(spec).samples(slice(None), 3, 5, normalize=False, dtype=torch.float64)
    torch.testing.assert_close(X.norm(dim=-1), torch.full((4, 3), 5**0.5, dtype=torch.float64))


# ------------------------------------------------------------------------------------------------------ datamodule


def datamodule(cache_dir, spec=None, **kw):
    args = dict(n=12, d=32, val_fraction=0.2, test_fraction=0.2, batch_size=4, progress=False)
    args.update(kw)
    return EmbeddingDataModule(spec or EmbeddingSpec(num_samples=M, cache_dir=str(cache_dir)), **args)


def test_datamodule_items_and_seeded_stratified_split(cache_dir, emb):
    dm = datamodule(cache_dir)
    assert (dm.n, dm.d) == (12, 32)
    dm.prepare_data()
    dm.setup("fit")
    tr, va, te = dm.train_indices, dm.val_indices, dm.test_indices
    assert (len(tr), len(va), len(te)) == (12, 4, 4)
    assert sorted(torch.cat([tr, va, te]).tolist()) == list(range(M))
    for idx in (tr, va, te):
        assert dm.embeddings.labels[idx].sum() == 0  # each split balanced
    dm2 = datamodule(cache_dir)
    dm2.setup("fit")
    assert torch.equal(dm2.val_indices, va) and torch.equal(dm2.test_indices, te)
    X, y, sid = dm.dataset(tr)[0]
    assert X.shape == (12, 32) and X.dtype == torch.float32
    assert y.shape == () and y.dtype == torch.float32 and sid.shape == () and sid.dtype == torch.int64
    assert sid == emb.sample_ids[tr[0]] and y == emb.labels[tr[0]]
    torch.testing.assert_close(X, emb.samples([int(tr[0])], 12, 32)[0][0])
    Xb, yb, sb = next(iter(dm.val_dataloader()))
    assert Xb.shape == (4, 12, 32) and yb.shape == (4,) and sb.tolist() == emb.sample_ids[va].tolist()
    assert dm.manifest["num_samples"] == M


def test_ddp_sharding_gives_each_rank_distinct_samples(cache_dir):
    dm = datamodule(cache_dir, val_fraction=0.0, test_fraction=0.0)
    dm.setup("fit")
    ds = dm.train_dataloader().dataset
    seen = []
    for rank in (0, 1):
        sampler = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=0)
        ids = torch.cat([b[2] for b in DataLoader(ds, batch_size=3, sampler=sampler)]).tolist()
        assert len(ids) == M // 2
        seen.append(set(ids))
    assert not (seen[0] & seen[1])
    assert seen[0] | seen[1] == set(dm.embeddings.sample_ids.tolist())


def test_dataloader_with_two_workers(cache_dir):
    dm = datamodule(cache_dir, num_workers=2)
    dm.setup("fit")
    got = []
    for X, y, sid in dm.train_dataloader():
        assert X.shape[1:] == (12, 32) and X.dtype == torch.float32
        torch.testing.assert_close(X.norm(dim=-1), torch.full(X.shape[:2], 32**0.5))
        got += list(zip(sid.tolist(), y.tolist(), strict=True))
    expect = {(int(dm.embeddings.sample_ids[i]), float(dm.embeddings.labels[i])) for i in dm.train_indices}
    assert sorted(got) == sorted(expect)


def test_datamodule_synthetic(tmp_path):
    spec = EmbeddingSpec(source="synthetic", num_samples=10, max_length=8, synthetic_dim=6, batch_size=3)
    dm = EmbeddingDataModule(spec, n=8, d=6, val_fraction=0.2, test_fraction=0.0, batch_size=5)
    dm.prepare_data()
    dm.setup("fit")
    X, y, sid = next(iter(dm.train_dataloader()))
    # the loader's batch is the DataModule's batch_size; the spec's batch_size (encoder batch) does not touch it
    assert X.shape == (5, 8, 6) and set(y.tolist()) <= {1.0, -1.0}
    assert dm.spec is spec and dm.hparams["embeddings"]["batch_size"] == 3 and dm.hparams["batch_size"] == 5
    assert not list(tmp_path.iterdir())


def test_split_seed_defaults_to_the_spec_seed_and_moves_only_the_split():
    spec = EmbeddingSpec(source="synthetic", num_samples=40, max_length=4, synthetic_dim=4, seed=5)
    kw = dict(n=4, d=4, val_fraction=0.25, test_fraction=0.25)
    default, same, other = (EmbeddingDataModule(spec, split_seed=s, **kw) for s in (None, 5, 6))
    for dm in (default, same, other):
        dm.setup("fit")
    assert default.seed == 5 and torch.equal(default.val_indices, same.val_indices)
    assert not torch.equal(default.val_indices, other.val_indices)
    assert torch.equal(default.embeddings.sample_ids, other.embeddings.sample_ids)  # the same samples, split apart
    # a dict of the spec's fields (a checkpoint's hyperparameters) is the same spec
    assert EmbeddingDataModule(dataclasses.asdict(spec), **kw).spec == spec


# --------------------------------------------------------------------------------------------------------- command


def test_build_command_prints_manifest(cache_dir, emb, capsys, monkeypatch):
    forbid_encoder(monkeypatch)
    assert data_main(["build", "--num-samples", str(M), "--cache-dir", str(cache_dir), "--no-progress"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1].startswith(f"cache: {emb.path} (hit in")
    manifest = json.loads("\n".join(out[:-1]))
    assert manifest["sha256"] == emb.manifest["sha256"] and manifest["shapes"]["embeddings"] == [M, 256, 384]


# ------------------------------------------------------------------------------------------------------- bad input


SPEC_KEYS = ("layer", "num_samples", "source", "selection", "storage_dtype", "max_length", "batch_size")


@pytest.mark.parametrize(
    "kw, pattern",
    [
        (
            dict(n=257),
            r"^n \(token positions stored per review, embeddings.max_length=256\) must be an integer in \[1, 256\], "
            r"got 257$",
        ),
        (dict(d=385), r"^d \(hidden size of 'bundled-minilm' is 384\) must be an integer in \[1, 384\], got 385$"),
        (
            dict(layer=7),
            r"^embeddings.layer \(0 = embedding layer; 'bundled-minilm' has num_hidden_layers=6\) must be an integer "
            r"in \[0, 6\], got 7$",
        ),
        (dict(layer=-1), r"^embeddings.layer must be an integer >= 0, got -1$"),
        (
            dict(num_samples=25_002),
            r"^embeddings.num_samples \(source 'imdb_offline' holds 25000 reviews\) must be an integer in "
            r"\[2, 25000\], got 25002$",
        ),
        (dict(num_samples=7), r"^embeddings.num_samples must be even.*got 7$"),
        (
            dict(source="yelp"),
            r"^embeddings.source must be one of \['imdb_offline', 'imdb_hub', 'synthetic'\], got 'yelp'$",
        ),
        (dict(selection="best"), r"^embeddings.selection must be one of \['random', 'first'\], got 'best'$"),
        (dict(storage_dtype="int8"), r"^embeddings.storage_dtype must be one of \['float16', 'float32'\], got 'int8'$"),
        (dict(max_length=1), r"^embeddings.max_length must be an integer >= 2, got 1$"),
        (dict(batch_size=0), r"^embeddings.batch_size must be a positive integer, got 0$"),
        (dict(val_fraction=0.6, test_fraction=0.5), r"^val_fraction \+ test_fraction must be < 1"),
        (dict(val_fraction=1.0), r"^val_fraction must be a finite number in \[0, 1\), got 1.0$"),
        (dict(test_fraction=-0.1), r"^test_fraction must be a finite number >= 0, got -0.1$"),
        (dict(loader_batch_size=0), r"^batch_size must be a positive integer, got 0$"),
        (dict(num_workers=-1), r"^num_workers must be an integer >= 0, got -1$"),
        (dict(split_seed=-2), r"^split_seed must be an integer >= 0 or None, got -2$"),
    ],
)
def test_bad_input_raises_before_the_encoder(tmp_path, monkeypatch, kw, pattern):
    forbid_encoder(monkeypatch)
    spec_kw = {k: v for k, v in kw.items() if k in SPEC_KEYS}
    dm_kw = {k: v for k, v in kw.items() if k not in SPEC_KEYS}
    if "loader_batch_size" in dm_kw:
        dm_kw["batch_size"] = dm_kw.pop("loader_batch_size")
    with pytest.raises(ValueError, match=pattern):
        EmbeddingDataModule(spec_for(tmp_path, **spec_kw), **{"n": 10, "d": 16, **dm_kw})
    if spec_kw:
        with pytest.raises(ValueError, match=pattern):
            load_token_embeddings(spec_for(tmp_path, **spec_kw))
    assert not list(tmp_path.glob("*.safetensors"))


def test_samples_out_of_range(emb):
    n_msg = r"^n \(stored token positions, max_length=256\) must be an integer in \[1, 256\], got 300$"
    with pytest.raises(ValueError, match=n_msg):
        emb.samples([0], 300, 10)
    with pytest.raises(ValueError, match=r"^d \(the embedding's hidden size is 384\) must be .* \[1, 384\], got 400$"):
        emb.samples([0], 10, 400)
    with pytest.raises(ValueError, match=r"^d \(the embedding's hidden size is 16\) must be .* \[1, 16\], got 17$"):
        preprocess(torch.zeros(1, 4, 16), 2, 17)
    with pytest.raises(ValueError, match=r"^verify must be one of \['full', 'size'\], got 'fast'$"):
        load_token_embeddings(EmbeddingSpec(source="synthetic", num_samples=2), verify="fast")


def test_more_samples_than_the_filtered_source_holds(tmp_path, monkeypatch):
    # a small source: 6 short and 2 long (300-token) positives, 6 short negatives
    texts = [f"a wonderful film, number {i}" for i in range(6)] + [f"a dull film, number {i}" for i in range(6)]
    texts += ["word " * 300] * 2
    labels = np.asarray([1] * 6 + [0] * 6 + [1, 1])
    small = TextCorpus("imdb_offline", "train", texts, labels, np.arange(len(texts)))
    monkeypatch.setattr(build_mod, "load_texts", lambda source: small)

    def no_encoder(*a, **k):
        raise AssertionError("the encoder must not load")

    monkeypatch.setattr(encoders, "load_encoder", no_encoder)
    with pytest.raises(ValueError, match=r"num_samples must be at most \d+ .*6 positive and 6 negative.*got 14"):
        load_token_embeddings(spec_for(tmp_path, num_samples=14, max_tokens=240))


def test_hub_without_network_fails_fast_naming_the_offline_config(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda *a, **k: None)  # nothing cached locally
    t = time.perf_counter()
    with pytest.raises(HubUnreachableError, match=r"bert-base-uncased.*configs/\*\.yaml"):
        load_token_embeddings(spec_for(tmp_path, source="imdb_hub", encoder="bert-base-uncased"))
    with pytest.raises(HubUnreachableError, match=r"imdb_hub.*source: imdb_offline"):
        load_token_embeddings(spec_for(tmp_path, source="imdb_hub"))  # hub text, local encoder
    assert time.perf_counter() - t < 30


@pytest.mark.slow  # reads and embeds the authors' first picks from the whole 25,000-review source: about 10 s
def test_first_selection_takes_the_authors_picks(tmp_path):
    e = load_token_embeddings(spec_for(tmp_path, num_samples=4, selection="first"), progress=False)
    corpus = load_texts("imdb_offline")
    _, tok, _ = encoders.load_encoder("bundled-minilm")
    short = [i for i in range(200) if len(tok.tokenize(corpus.texts[i])) < 240][:2]  # first short negatives
    short += [i for i in range(12_500, 12_700) if len(tok.tokenize(corpus.texts[i])) < 240][:2]  # and positives
    assert sorted(e.sample_ids.tolist()) == short


def test_first_copies_flags_a_review_held_twice(emb):
    """A sample whose token ids repeat an earlier sample's is not a first copy, so the attack never draws both."""
    first = emb.first_copies()
    assert first.shape == (len(emb),) and bool(first.all())  # the M reviews of the cache are distinct
    ids = np.asarray(emb._map("input_ids")).copy()
    ids[5] = ids[2]  # sample 5 now repeats sample 2
    store = pickle.loads(pickle.dumps(emb))
    store._maps, store._first = {"input_ids": ids}, None
    flags = store.first_copies()
    assert flags.tolist() == [i != 5 for i in range(len(emb))]
