"""Word sensitivity S_phi(X) of any feature map: a pure, batched estimator (paper.md §3, §5, §10b).

    S_phi(X) = sup_i sup_{||Delta|| <= r} ||phi(X^i(Delta)) - phi(X)|| / ||phi(X)||,   X^i(Delta) = X + e_i Delta^T,

with r = sqrt(d) by default (paper.md §3.1). `word_sensitivity` maximises the inner sup for a batch of samples, several
positions and several restarts at once, in one tensor program per chunk of positions (no Python loop over samples or
restarts). Each evaluation goes through the map's single-token algebra (`wslight.features.single_token`): RF and
DeepRF move only z + V^{(i)} Delta (O(k d) per step; the memory-bounded RF never holds V), RAF / ReLU-RAF recompute
only row and column i of the scores (O(n d + d^2) per step), and any other module is differentiated through its full
forward.

No Lightning import: this is plain maths, called by the Lightning callbacks and usable from a notebook.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import torch
from torch import Tensor, nn

from . import validate
from .ascent import DEFAULT_CHUNK_ELEMENTS, Search, WSResult
from .features import RandomFeatures, map_dims
from .features.single_token import map_features, single_token, token_class_for

# Lipschitz constants of the RF activations (for the bound of paper.md §12.3); GELU's derivative peaks at about 1.1289.
LIPSCHITZ = {"relu": 1.0, "tanh": 1.0, "gelu": 1.1289}


def word_sensitivity(
    feature_map: nn.Module | Sequence[nn.Module],
    X: Tensor,
    positions: Literal["first", "all"] | Sequence[int] = "first",
    radius: float | None = None,
    restarts: int = 4,
    max_steps: int = 500,
    lr: float = 0.25,
    tol: float = 1e-4,
    window: int = 20,
    seed: int | Sequence[int] = 0,
    dtype: Literal["float32", "float64"] | torch.dtype | None = None,
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
    power_iters: int = 20,
) -> WSResult:
    """Estimate the word sensitivity S_phi(X) of each sample of a batch (paper.md §3.1).

    All samples, positions and restarts ascend together; positions (then restarts) are chunked only to keep about
    `chunk_elements` working-dtype elements alive. The search maximises ||phi(X^i(Delta)) - phi(X)||^2 by the monotone
    projected normalised-gradient ascent of `_ascend`; the value at the best Delta is recomputed in float64 with the
    full map.

    Restarts per (sample, position), all on the sphere of the given radius: restarts 0 and 1 are plus and minus the
    top eigenvector of the Hessian of the squared change at Delta = 0 (the direction in which phi moves fastest, found
    by `power_iters` Hessian-vector products; a small-step ascent from near the clean token, as in the authors' code,
    drifts towards it). Then come the map's own starting directions (RAF/ReLU-RAF: the attention-attracting
    construction of paper.md §5.3, Delta = radius W^T xbar / ||W^T xbar|| (an inferred construction), and a start that
    steers query i onto the key m that changes its output most, Delta ∝ W x_m). Further restarts start at random
    points, drawn from `wslight.seeding.generator(seed, "ws.init", position)`, so a chain does not depend on the
    chunking or on the other positions requested.

    The reported S is recomputed in float64 with the full map (the map's weights cast to float64) at the best Delta.
    On the memory-bounded RF path, z = V flat(X) comes from the full V in float64 in the same pass that extracts the
    blocks, and the perturbed value uses the exact identity z + V^{(i)} Delta, which avoids generating V a second time.

    Args:
        feature_map: any nn.Module mapping (B, n, d) to (B, p) with an int attribute `d` (and `n` when it is built for
            one length): the four maps of `wslight.features` use their closed forms, any other module autograd.
            A list of T maps (trials) takes X of shape (T, B, n, d) and searches all trials in one program.
        X: (B, n, d) clean samples (rows of norm sqrt(d) under the paper's assumption); (T, B, n, d) with T maps.
        positions: "first" (token 0, the paper's figures), "all" (the true sup over i), or a list of token indices.
        radius: radius of the ball of Delta; None means sqrt(d) (paper.md §3.1). Must be > 0.
        restarts: chains per sample and position (>= 1).
        max_steps: most ascent steps per chain.
        lr: initial step, as a fraction of the radius (adapted per chain afterwards).
        tol: a chain stops when its S grew by a relative amount below tol over `window` steps.
        window: the convergence window, in steps.
        seed: seed of the random restarts (a list: one per trial).
        dtype: working dtype of the search ("float32" or "float64"); None means the map's dtype.
        chunk_elements: memory bound of one chunk, in working-dtype elements.
        power_iters: Hessian-vector products of the curvature starts.

    Returns:
        WSResult with per-sample ws, position, delta, delta_norm, phi_norm, steps (float64 / long, on the CPU):
        (B,) each for one map, (T, B) for a list of T maps.

    Raises:
        ValueError: a bad argument, named in the message, before any heavy work.
    """
    trials = isinstance(feature_map, (list, tuple, nn.ModuleList))
    maps = list(feature_map) if trials else [feature_map]
    if not maps:
        raise ValueError("feature_map: expected a map or a non-empty list of maps, got an empty list")
    d, n_map = map_dims(maps[0])
    for m in maps[1:]:
        if map_dims(m) != (d, n_map):
            raise ValueError(f"feature_map: every map of a list must have the same d and n, got {map_dims(m)}")
    if trials:
        if not isinstance(X, Tensor) or X.dim() != 4 or X.shape[0] != len(maps):
            shape = tuple(X.shape) if isinstance(X, Tensor) else type(X).__name__
            raise ValueError(f"X: a list of {len(maps)} maps takes X of shape ({len(maps)}, B, n, d), got {shape}")
        X4 = torch.stack([validate.samples("X", x, d, n_map) for x in X])
    else:
        X4 = validate.samples("X", X, d, n_map)[None]
    search = Search.checked(
        d, X4.shape[2], positions, radius, restarts, max_steps, lr, tol, window, chunk_elements, power_iters
    )
    seeds = list(seed) if isinstance(seed, (list, tuple)) else [seed] * len(maps)
    if len(seeds) != len(maps):
        raise ValueError(f"seed: expected one seed or {len(maps)} (one per map), got {len(seeds)}")
    dt = working_dtype(maps[0], dtype)
    device = _device(maps[0])
    X4 = X4.to(device)
    per_chain, per_pos = token_class_for(maps).chain_elements(maps, X4.shape[1], X4.shape[2], d)

    def exact(Xp: Tensor) -> Tensor:  # (T, 2B, n, d) float64 -> (T, 2B, p): the full maps in float64
        return torch.stack([map_features(m, x, exact=True, chunk=x.shape[0]) for m, x in zip(maps, Xp)])

    res = search.run(lambda pos: single_token(maps, X4, pos, dt), exact, X4, seeds, dt, per_chain, per_pos)
    return res if trials else WSResult(*(getattr(res, f)[0] for f in WSResult.__dataclass_fields__))


def fresh_word_sensitivity(
    name: str,
    X: Tensor,
    seeds: Sequence[int],
    restart_seeds: Sequence[int] | None = None,
    depth: int = 2,
    width_ratio: float = 1.0,
    positions: Literal["first", "all"] | Sequence[int] = "first",
    radius: float | None = None,
    restarts: int = 4,
    max_steps: int = 500,
    lr: float = 0.25,
    tol: float = 1e-4,
    window: int = 20,
    dtype: Literal["float32", "float64"] = "float32",
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
    power_iters: int = 20,
    device: str | torch.device | None = None,
) -> WSResult:
    """Word sensitivity of T independent trials, each with a fresh map of the registered kind `name` (the paper's
    protocol), searched together in one program.

    RF and DeepRF never build their maps: for the positions searched, a fresh map enters only through
    (z = V flat(X), V^(i)), which are drawn from their exact joint law (`RFToken.fresh`, docs/theory.md §3), k (P d + B)
    random numbers per trial instead of k D (DeepRF: its first layer so; deeper layers are drawn dense). Other maps
    are built with `make_map(name, n, d, seed)` and stacked. With positions "all" (every block of V needed) RF and
    DeepRF build their maps too.

    Args:
        name: a registered map ("rf", "deep_rf", "raf", "relu_raf", ...).
        X: (T, B, n, d) samples; trial t uses the map seeded seeds[t].
        seeds: T map seeds.
        restart_seeds: T seeds of the random restarts (None: the map seeds).
        depth, width_ratio: as in `make_map` (RF neurons / DeepRF width = round(width_ratio n d)).
        The other arguments are those of `word_sensitivity`.

    Returns:
        WSResult with (T, B) fields.
    """
    from .features import MAPS, make_map
    from .features.deep_rf import DeepRFToken
    from .features.rf import RFToken

    validate.choice("map", name, sorted(MAPS))
    if not isinstance(X, Tensor) or X.dim() != 4:
        raise ValueError(f"X must be a tensor of shape (T, B, n, d), got {getattr(X, 'shape', type(X).__name__)}")
    T, B, n, d = X.shape
    seeds = [int(s) for s in seeds]
    if len(seeds) != T:
        raise ValueError(f"seeds: expected {T} map seeds (one per trial), got {len(seeds)}")
    restart_seeds = seeds if restart_seeds is None else [int(s) for s in restart_seeds]
    search = Search.checked(
        d, n, positions, radius, restarts, max_steps, lr, tol, window, chunk_elements, power_iters
    )
    width = max(1, round(validate.number("width_ratio", width_ratio, 0.0, strict=True) * n * d))
    dt = validate.dtype("dtype", dtype)
    X = validate.samples("X", X.flatten(0, 1), d, None).reshape(T, B, n, d).to(device or "cpu")
    law = name in ("rf", "deep_rf") and positions != "all"
    if not law:
        maps = [make_map(name, n, d, seed=s, depth=depth, width_ratio=width_ratio, dtype=dtype, device=device)
                for s in seeds]
        return word_sensitivity(
            maps, X, positions=positions, radius=radius, restarts=restarts, max_steps=max_steps, lr=lr, tol=tol,
            window=window, seed=restart_seeds, dtype=dtype, chunk_elements=chunk_elements, power_iters=power_iters,
        )
    if name == "rf":
        per_chain, per_pos = 6 * width, width * d
        build = lambda pos: RFToken.fresh(X, pos, seeds, k=width, dtype=dt)  # noqa: E731
    else:
        validate.positive_int("depth", depth)
        per_chain, per_pos = 4 * width * depth, width * d + (depth - 1) * width * width
        build = lambda pos: DeepRFToken.fresh(X, pos, seeds, depth=depth, width=width, dtype=dt)  # noqa: E731
    return search.run(build, None, X, restart_seeds, dt, per_chain, per_pos, one_chunk=True)


def single_token_objective(
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
    token = single_token([feature_map], X[None].to(_device(feature_map)), pos, working_dtype(feature_map, dtype))
    return lambda delta: token.change_sq(delta[None])[0]


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
    """Upper bound on the RF word sensitivity at one position (paper.md §5.1, §12.3).

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
