"""Word sensitivity S_phi(X) of any feature map: a pure, batched estimator.

See docs/theory/search.md §4, docs/theory/index.md §1.4, docs/theory/maps.md §3.

    S_phi(X) = sup_i sup_{||Delta|| <= r} ||phi(X^i(Delta)) - phi(X)|| / ||phi(X)||,   X^i(Delta) = X + e_i Delta^T,

with r = sqrt(d) by default (docs/theory/index.md §1.3). `word_sensitivity` maximises the inner sup for a batch of
samples, several positions and several chains at once, in one tensor program per chunk of positions (no Python loop over
samples or chains). Each evaluation goes through the map's token-move algebra (`wslight.features.move`): RF
and DeepRF move only z + V^{(i)} Delta (O(k d) per step; the memory-bounded RF never holds V), RAF / ReLU-RAF recompute
only row and column i of the scores (O(n d + d^2) per step), and any other module is differentiated through its full
forward.

No Lightning import: this is plain maths, called by the Lightning callbacks and usable from a notebook.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence, Sized
from typing import Any, Literal, cast

import torch
from torch import Tensor, nn

from ..base import validate
from ..chains.settings import SearchSettings
from ..features import MAPS, FreshMaps, RandomFeatures, family_defaults, map_dims
from ..features.forwards import map_features
from ..features.generic_move import move_class_for, token_move
from ..features.rf import LIPSCHITZ
from .estimator import estimate
from .result import WSResult
from .rounds import Rounds
from .start_plan import StartPlan


def word_sensitivity(
    feature_map: nn.Module | Sequence[nn.Module] | FreshMaps,
    X: Tensor,
    positions: Literal["first", "all"] | Sequence[int] = "first",
    search: SearchSettings | None = None,
    seed: int | Sequence[int] = 0,
    dtype: Literal["float32", "float64"] | torch.dtype | None = None,
    radius: float | None = None,
    start_plan: StartPlan | None = None,
    **changes: Any,
) -> WSResult:
    """Estimate the word sensitivity S_phi(X) of each sample of a batch (docs/theory/index.md §1.3).

    All samples, positions and chains ascend together; positions (then chains) are chunked only to keep about
    search.chunk_elements working-dtype elements alive. The search maximises ||phi(X^i(Delta)) - phi(X)||^2 by the
    monotone projected normalised-gradient ascent of `_ascend`; the value at the best Delta is recomputed in float64
    with the full map.

    The first round's chains per (sample, position), all on the sphere of the given radius: chains 0 and 1 are plus
    and minus the top eigenvector of the Hessian of the squared change at Delta = 0 (the direction in which phi moves
    fastest, found by search.power_iters Hessian-vector products; a small-step ascent from near the clean token, as in
    the authors' code, drifts towards it). Then come the map's own starting directions (RAF/ReLU-RAF: the
    attention-attracting construction of docs/theory/maps.md §3.5, Delta = radius W^T xbar / ||W^T xbar|| (an inferred
    construction), and a start that steers query i onto the key m that changes its output most, Delta ∝ W x_m;
    RAF also: the Delta that maximises query i's self score and its mix with the attracting one; ReLU-RAF: starts
    where query i attends to itself alone, docs/theory/search.md §4.3). Further chains start at random
    points, drawn from `wslight.base.seeding.generator(seed, "ws.init", position)` (round r > 0: `(seed, "ws.init",
    position, r)`), so a chain does not depend on the chunking or on the other positions requested.

    The reported S is recomputed in float64 with the full map (the map's weights cast to float64) at the best Delta.
    On the memory-bounded RF path, z = V flat(X) comes from the full V in float64 in the same pass that extracts the
    blocks, and the perturbed value uses the exact identity z + V^{(i)} Delta, which avoids generating V a second time.

    Args:
        feature_map: any nn.Module mapping (B, n, d) to (B, p) with an int attribute `d` (and `n` when it is built for
            one length): the four maps of `wslight.features` use their closed forms, any other module autograd.
            A list of T maps (trials), or `FreshMaps` (T fresh maps of one kind, the paper's protocol: RF and DeepRF
            drawn from the law of (z, V^(i)), docs/theory/maps.md §3.6), takes X of shape (T, B, n, d) and searches
            all trials in one program.
        X: (B, n, d) clean samples (rows of norm sqrt(d) under the paper's assumption); (T, B, n, d) with T maps.
        positions: "first" (token 0, the paper's figures), "all" (the true sup over i), or a list of token indices.
        search: the search's settings (`SearchSettings`: chains per round, rounds, stops, radius, memory); a field
            left at None takes the map family's default (its class's `search_defaults`), else the generic one. None:
            every field at its default, which searches as tightly as the shipped config of the map.
        seed: seed of the random starts (a list: one per trial).
        dtype: working dtype of the search ("float32" or "float64"); None means the map's dtype (FreshMaps: theirs).
        radius: radius of the ball of Delta; None means search.radius_scale * sqrt(d) (docs/theory/index.md §1.3). > 0.
        start_plan: where chains start beyond the map's own starts (`StartPlan`: the generic path's wider first round,
            homotopy and polishing, the confirmation round's jitter); None: the shipped plan.
        **changes: fields of `search` to change for this call (`chains_per_round=12`); an unknown name is refused.

    Returns:
        WSResult with per-sample ws, position, delta, delta_norm, phi_norm, steps, chains, near_best (float64 /
        long, on the CPU):
        (B,) each for one map, (T, B) for a list of T maps.

    Raises:
        ValueError: a bad argument, named in the message, before any heavy work.
    """
    trials = isinstance(feature_map, (FreshMaps, list, tuple, nn.ModuleList))
    maps, dt, samples = _maps_and_samples(feature_map, X, trials, positions, dtype)
    d = samples.shape[3]
    family = family_defaults(MAPS.get(maps.name) if isinstance(maps, FreshMaps) else maps[0])
    settings = (search or SearchSettings()).replace(**changes).resolved(family)
    pos = validate.positions("positions", positions, samples.shape[2])
    radius = settings.radius(d) if radius is None else validate.number("radius", radius, 0.0, strict=True)
    rounds = Rounds(settings, radius, start_plan if start_plan is not None else StartPlan())
    seeds = _trial_seeds(seed, samples.shape[0])
    res = _estimate_all(rounds, pos, maps, samples, seeds, dt)
    if trials:
        return res
    first: dict[str, Any] = {k: None if v is None else v[0] for k, v in vars(res).items()}  # the one trial's (B,)
    return WSResult(**first)


def _estimate_all(
    rounds: Rounds,
    pos: list[int],
    maps: FreshMaps | list[nn.Module],
    samples: Tensor,
    seeds: list[int],
    dt: torch.dtype,
) -> WSResult:
    """The estimate of every trial: maps drawn for each chunk of positions (FreshMaps from their law), else built."""
    T, B, n, d = samples.shape
    if isinstance(maps, FreshMaps):
        fresh = maps
        per_chain, per_pos = fresh.chain_elements(B, n, d)
        return estimate(
            rounds, pos, lambda p: fresh.move(samples, p), None, samples, seeds, dt, per_chain, per_pos, True
        )
    built = maps
    per_chain, per_pos = move_class_for(built).chain_elements(built, B, n, d)

    def exact(Xp: Tensor) -> Tensor:  # (T, 2B, n, d) float64 -> (T, 2B, p): the full maps in float64
        return torch.stack([map_features(m, x, exact=True, chunk=x.shape[0]) for m, x in zip(built, Xp)])

    return estimate(
        rounds, pos, lambda p: token_move(built, samples, p, dt), exact, samples, seeds, dt, per_chain, per_pos
    )


def _check_trial_samples(feature_map: Any, X: Any) -> None:
    """Refuse samples X that are not (T, B, n, d) for T maps (a list of maps or `FreshMaps`, one per trial)."""
    T = len(cast(Sized, feature_map))  # FreshMaps or a list of maps
    if not isinstance(X, Tensor) or X.dim() != 4 or X.shape[0] != T:
        shape = tuple(X.shape) if isinstance(X, Tensor) else type(X).__name__
        raise ValueError(f"X: {T} maps (one per trial) take X of shape ({T}, B, n, d), got {shape}")


def _maps_and_samples(
    feature_map: Any, X: Tensor, trials: bool, positions: object, dtype: object
) -> tuple[FreshMaps | list[nn.Module], torch.dtype, Tensor]:
    """The trials' maps (FreshMaps drawn from their law, else built), the working dtype and the checked samples.

    The samples come out as (T, B, n, d), one trial per map; a bad shape is refused naming X.
    """
    if trials:
        _check_trial_samples(feature_map, X)
    fresh = feature_map if isinstance(feature_map, FreshMaps) else None
    if fresh is not None and not (fresh.drawn_from_law and positions != "all"):
        feature_map, fresh = fresh.maps(X.shape[2], X.shape[3]), None  # built in full
    maps: FreshMaps | list[nn.Module]
    if fresh is not None:
        maps, d, n_map, dt = fresh, X.shape[3], None, fresh.working_dtype
        samples = X.to(fresh.device or X.device)
    else:
        maps, d, n_map, dt, samples = _built_maps(feature_map, X, trials, dtype)
    if not isinstance(samples, Tensor) or samples.dim() != 4:
        validate.samples("X", X, d, n_map)  # the error names the shape received
    samples = validate.samples("X", samples.flatten(0, 1), d, n_map).reshape(samples.shape)
    return maps, dt, samples


def _built_maps(
    feature_map: Any, X: Tensor, trials: bool, dtype: object
) -> tuple[list[nn.Module], int, int | None, torch.dtype, Tensor]:
    """The maps of a search over built maps, their d and n, the working dtype and the samples (T, B, n, d).

    A list of maps (given, or FreshMaps built in full) must share d and n; one map is one trial. The samples move to
    the first map's device; they are checked afterwards.
    """
    # a list of maps (given, or FreshMaps built in full), else one map
    maps = list(cast(Iterable[nn.Module], feature_map)) if trials else [cast(nn.Module, feature_map)]
    if not maps:
        raise ValueError("feature_map: expected a map or a non-empty list of maps, got an empty list")
    d, n_map = map_dims(maps[0])
    for m in maps[1:]:
        if map_dims(m) != (d, n_map):
            raise ValueError(f"feature_map: every map of a list must have the same d and n, got {map_dims(m)}")
    dt = working_dtype(maps[0], dtype)
    samples = X if trials else X[None] if isinstance(X, Tensor) else X
    samples = samples.to(_device(maps[0])) if isinstance(samples, Tensor) else samples
    return maps, d, n_map, dt, samples


def _trial_seeds(seed: int | Sequence[int], T: int) -> list[int]:
    """One seed per trial: the given list (one per trial), or the one seed repeated."""
    seeds = cast(list[int], list(seed) if isinstance(seed, (list, tuple)) else [seed] * T)
    if len(seeds) != T:
        raise ValueError(f"seed: expected one seed or {T} (one per trial), got {len(seeds)}")
    return seeds


def moved_token_objective(
    feature_map: nn.Module, X: Tensor, positions: Sequence[int], dtype: str | torch.dtype | None = None
) -> Callable[[Tensor], Tensor]:
    """The objective Delta -> ||phi(X^i(Delta)) - phi(X)||^2 of one map for a batch, positions and chains.

    Args:
        feature_map: any map (see `word_sensitivity`).
        X: (B, n, d) clean samples.
        positions: P token indices.
        dtype: working dtype (default: the map's).

    Returns:
        A function (B, P, R, d) -> (B, P, R): the squared change of the features for every chain.
    """
    d, n = map_dims(feature_map)
    X = validate.samples("X", X, d, n)
    pos = validate.positions("positions", list(positions), X.shape[1])
    move = token_move([feature_map], X[None].to(_device(feature_map)), pos, working_dtype(feature_map, dtype))
    return lambda delta: move.change_sq(delta[None])[0]


def working_dtype(feature_map: nn.Module, dtype: object) -> torch.dtype:
    """`dtype` as a torch dtype; None means the map's own."""
    if dtype is None:
        w = getattr(feature_map, "weight_dtype", None)
        return w if isinstance(w, torch.dtype) else torch.float32
    return validate.dtype("dtype", dtype, allow_none=True)


def _device(feature_map: nn.Module) -> torch.device:
    t = next(iter(feature_map.buffers()), None)
    t = t if t is not None else next(iter(feature_map.parameters()), None)
    return getattr(feature_map, "weight_device", t.device if t is not None else torch.device("cpu"))


def ws_bound_rf(
    feature_map: RandomFeatures,
    X: Tensor,
    position: int | Tensor,
    delta_norm: float | Tensor,
    phi_norm: Tensor | None = None,
) -> Tensor:
    """Upper bound on the RF word sensitivity at one position (docs/theory/maps.md §3.2, docs/theory/checks.md §8.3).

        S <= Lip(phi) ||V^{(i)}||_op ||Delta|| / ||phi(X)||,

    a hard bound since phi is Lipschitz (ReLU: 1). Evaluate it with the realised ||Delta|| of each sample.

    Args:
        feature_map: a RandomFeatures map.
        X: (B, n, d) clean samples.
        position: the perturbed token, one int or a (B,) tensor (e.g. WSResult.position).
        delta_norm: ||Delta||, a number or a (B,) tensor (e.g. WSResult.delta_norm).
        phi_norm: optional (B,) ||phi(X)|| (e.g. WSResult.phi_norm) to skip a pass over V.

    Returns:
        (B,) float64 bound per sample.
    """
    if not isinstance(feature_map, RandomFeatures):
        raise ValueError(f"feature_map must be a RandomFeatures map, got {type(feature_map).__name__}")
    X = validate.samples("X", X, feature_map.d, feature_map.n)
    B = X.shape[0]
    pos = torch.as_tensor(position, dtype=torch.long).reshape(-1).cpu()
    if pos.numel() == 1:
        pos = pos.expand(B)
    if pos.numel() != B or (pos < 0).any() or (pos >= feature_map.n).any():
        raise ValueError(
            f"position must be an int or (B,) tensor of ints in [0, {feature_map.n - 1}], got {position!r}"
        )
    uniq = sorted(set(pos.tolist()))
    _, blocks = feature_map.preactivations_and_token_blocks(X[:1], uniq)  # (U, k, d)
    blocks = blocks.to(torch.float64)
    op = torch.linalg.eigvalsh(blocks.transpose(1, 2) @ blocks)[:, -1].clamp_min(0).sqrt().cpu()  # (U,)
    op_per_sample = op[torch.tensor([uniq.index(p) for p in pos.tolist()])]
    if phi_norm is None:
        phi_norm = map_features(feature_map, X, exact=True, chunk=X.shape[0]).norm(dim=1).cpu()
    dn = torch.as_tensor(delta_norm, dtype=torch.float64).cpu()
    return LIPSCHITZ[feature_map.activation] * op_per_sample * dn / phi_norm.to(torch.float64)
