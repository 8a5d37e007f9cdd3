"""The base of the evaluations that read token embeddings: the store opened once, the sizes checked against it."""

from __future__ import annotations

from typing import Any

from .evaluation import Evaluation


class EmbeddingsEvaluation(Evaluation):
    """An evaluation that draws its samples from `self.embeddings` (an EmbeddingSpec), opened once on first use."""

    embeddings: Any  # an EmbeddingSpec
    _store = None

    @property
    def store(self) -> Any:
        """The TokenEmbeddings of `self.embeddings` (built or read from the cache on first use)."""
        if self._store is None:
            from ..data import load_token_embeddings

            self._store = load_token_embeddings(self.embeddings, progress=self.trainer.is_global_zero)
        return self._store

    def open_inputs(self) -> None:
        """Open the embedding store on first use (its checksum is read once a run, outside every trial's seconds)."""
        _ = self.store

    def set_embeddings(self, spec: Any, d_key: str, d_max: int, n_key: str, n_max: int) -> None:
        """Check the spec and that the grid fits it (before any trial runs), then keep it as `self.embeddings`.

        Args:
            spec: an EmbeddingSpec, or None for the default one.
            d_key: the config key of the largest embedding dimension asked for (e.g. `d_values`).
            d_max: that dimension; at most the embeddings' hidden size.
            n_key: the config key of the largest context length (e.g. `cases.n`).
            n_max: that length; at most `embeddings.max_length`.
        """
        from ..data import EmbeddingSpec
        from ..data.spec import hidden_size_of, validate_spec

        spec = spec if spec is not None else EmbeddingSpec()
        validate_spec(spec, "embeddings")  # bad data keys (layer, num_samples, source...) before any trial runs
        hidden = hidden_size_of(spec)
        if d_max > hidden:
            raise ValueError(f"{d_key}: d must be <= {hidden} (the embeddings' hidden size), got {d_max}")
        if n_max > spec.max_length:
            raise ValueError(f"{n_key}: n must be <= {spec.max_length} (embeddings.max_length), got {n_max}")
        self.embeddings = spec
