"""How a search batches its positions and chains within its memory bound (`SearchSettings.chunk_elements`)."""

from __future__ import annotations

from ..chains.settings import ResolvedSearch


def chunk_sizes(
    settings: ResolvedSearch, P: int, T: int, B: int, per_chain: int, per_pos: int, one_chunk: bool
) -> tuple[int, int]:
    """Positions per chunk and chains per batch of a search of P positions for T trials of B samples.

    Within `settings.chunk_elements`. `per_chain` and `per_pos`: the working elements of one chain and of one position
    of one trial; `one_chunk`: all positions in one chunk.
    """
    # the first round carries the second round's chains when there is a second round (`Rounds.run`)
    wide = settings.chains_per_round * (2 if settings.max_chains > settings.chains_per_round else 1)
    chains_per_pos = T * B * wide
    pos_chunk = max(1, settings.chunk_elements // (chains_per_pos * per_chain + T * per_pos))
    pos_chunk = P if one_chunk else pos_chunk
    chain_chunk = wide
    if pos_chunk == 1 and chains_per_pos * per_chain + T * per_pos > settings.chunk_elements:
        # the position's own memory (e.g. RF blocks) is held whatever the chain batching, so the chains of one
        # position get the whole budget: splitting them would only re-read that memory once per batch
        chain_chunk = max(1, settings.chunk_elements // max(1, T * B * per_chain))
    return pos_chunk, chain_chunk


def generic_chunk(chunk_elements: int, per_chain: int) -> int:
    """Chains per batch on the generic path: as many as `chunk_elements` holds (at least one).

    `per_chain`: the elements one chain of every trial, sample and position takes. A batch costs a forward and a
    backward of the module a step, much of it per call at small n (the pre-trained layer at n = 8, one review: 7 s
    with every chain of a round in one batch, 28 s in batches of a round's width, the same S), and the chains are
    independent: the same paths, batched otherwise.
    """
    return max(1, chunk_elements // max(1, per_chain))
