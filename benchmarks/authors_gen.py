"""One trial of the Delta attack by the authors' own code: their utils.py functions, called as their gen.py calls them.

The authors' repository (github.com/simone-bombari/attention-sensitivity, commit b984775) has no license, so none of
its code is copied here: `make authors-code` clones it into benchmarks/authors/attention-sensitivity (git-ignored),
`load_utils` imports its utils.py from there, and `authors_trial` makes the calls of one iteration of gen.py's loop
over (N, n) with their functions, in their order, on the inputs it is given. gen.py's top level is a script (argument
parsing, a pickle of BERT embeddings, a sleep, a results file), so its per-trial body is reproduced below line by line
with only the inputs adapted: the samples, labels and map weights are passed in (the package's side sees the same),
where gen.py draws them from its pickle and from np.random.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from pathlib import Path
from types import ModuleType

import numpy as np
import torch

AUTHORS_REPO = "https://github.com/simone-bombari/attention-sensitivity"
AUTHORS_COMMIT = "b984775"
# Where `make authors-code` puts the clone (relative to the repository root).
AUTHORS_DIR = Path(__file__).resolve().parent / "authors" / "attention-sensitivity"
# Their map names (gen.py --map) for the package's.
AUTHORS_MAPS = {"raf": "raf", "relu_raf": "raf_relu", "rf": "rf"}


def how_to_get(folder: Path) -> str:
    """The one line that says how to fetch the authors' code into `folder`."""
    return (
        f"the authors' code is not in {folder}: `make authors-code` fetches it (git clone {AUTHORS_REPO}, "
        f"checkout {AUTHORS_COMMIT})"
    )


def load_utils(folder: Path) -> ModuleType:
    """Their utils.py, imported from `folder` (gen.py's `from utils import *`)."""
    spec = importlib.util.spec_from_file_location("authors_utils", Path(folder) / "utils.py")
    if spec is None or spec.loader is None:
        raise FileNotFoundError(how_to_get(Path(folder)))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def authors_trial(
    utils: ModuleType,
    Xs: np.ndarray,
    Y: np.ndarray,
    x: np.ndarray,
    y: np.ndarray,
    W: np.ndarray,
    map_name: str = "raf",
    training: str = "total",
    optim: str = "loss",
) -> dict[str, float]:
    """Lines 84-183 of gen.py (one trial after the data and the weights are drawn) with their functions.

    Their per-step progress line (gen.py line 170) is printed as they print it; the caller may redirect stdout. The
    results file (lines 185-186) is replaced by the returned values.

    Args:
        utils: their utils.py (`load_utils`).
        Xs: (N, n, d) training samples, rows of norm sqrt(d) (gen.py lines 63-67 do this to their embeddings).
        Y: (N,) labels +-1.
        x: (n, d) the context sample, rows of norm sqrt(d) (lines 69-73).
        y: () its label, a 0-d array.
        W: (d, d) the RAF / ReLU-RAF weights (line 82), or RF's (k, n d) V (line 80).
        map_name: their --map: "raf", "raf_relu" or "rf".
        training: their --training: "total" (re-trained) or "fine_tuning".
        optim: their --optim: "loss" (16) or "feat_align" (24b); "features" refers to an undefined name in gen.py.

    Returns:
        t0, t1, D0, D1: gen.py's output line.
    """
    map_, map_numpy = {
        "raf": (utils.attention_softmax, utils.attention_numpy_softmax),
        "raf_relu": (utils.relu_attention, utils.relu_attention_numpy),
        "rf": (utils.rf, utils.rf_numpy),
    }[map_name]
    n, d = x.shape
    D = d * n
    penalty = 0  # line 47

    # lines 84-91: the training features, one concatenation per sample
    Phi = None
    for X in Xs:
        phi = map_numpy(X, W)
        phi = phi.flatten()
        if Phi is None:
            Phi = [phi]
        else:
            Phi = np.concatenate([Phi, [phi]], axis=0)

    # lines 93-95: the pseudo-inverse, theta* and the dense D x D projector
    Phip = np.linalg.pinv(Phi)
    theta = Phip @ Y
    P_o = np.identity(D) - Phip @ Phi

    # lines 97-98
    phi = map_numpy(x, W)
    phi = phi.flatten()

    # lines 100-105: the re-trained head from the pseudo-inverse of the stacked system, or the fine-tuned one
    if training == "total":
        Phi1 = np.concatenate([Phi, [phi]], axis=0)
        Y1 = np.append(Y, y)
        theta1 = np.linalg.pinv(Phi1) @ Y1
    elif training == "fine_tuning":
        theta1 = theta + phi * (y - np.inner(phi, theta)) / np.linalg.norm(phi) ** 2

    # lines 107-121
    xt = torch.tensor(x[0], requires_grad=True)
    X_1 = torch.tensor(x[1:])
    W = torch.tensor(W)
    x0 = xt.clone().detach()
    X_1_debug = X_1.clone().detach()
    target = torch.tensor(-y).double()
    Po_phi = torch.tensor(P_o @ phi).clone().detach()
    Po_phi = Po_phi / torch.norm(Po_phi, p=2) ** 2
    just_phi = torch.tensor(phi).clone().detach()
    just_phi = just_phi / torch.norm(just_phi, p=2) ** 2
    loss_function = torch.nn.MSELoss()

    # lines 123-129
    if "rf" in map_name:
        lr = 100.0
        num_steps = 300
    else:
        lr = 1.0
        num_steps = 50 * n

    # lines 135-170: plain projected gradient descent from the clean token, their progress line at every step
    for _ in range(num_steps):
        Xt = torch.cat((xt.unsqueeze(dim=0), X_1.detach()), dim=0).double()
        features = map_(Xt, W)
        if optim == "feat_align":
            out = torch.dot(features.view(-1), Po_phi.view(-1).double())
            loss = loss_function(out, torch.tensor(-1).double())
        else:  # "loss"
            out = torch.dot(features.view(-1), torch.tensor(theta1))
            loss = loss_function(out, target)
        if penalty > 0:
            pen_loss = torch.dot(features.view(-1) - just_phi.view(-1).double(), torch.tensor(theta).double()) ** 2
            loss = loss + penalty * pen_loss
        loss.backward()
        with torch.no_grad():
            xt.data = xt.data - lr * xt.grad.data
            utils.project(xt, x0, np.sqrt(d))
        xt.grad.zero_()
        distance_xt = torch.dist(xt, x0)
        distance_X_1 = torch.dist(X_1, X_1_debug)  # noqa: F841 (computed and unused in gen.py too)
        XD = Xt.clone().detach()
        phiD = map_(XD, W).numpy().flatten()
        D0 = phiD.transpose() @ theta
        t0 = phi.transpose() @ theta
        print(distance_xt.item(), loss.item(), D0, t0, flush=True)

    # lines 173-183: the outputs at the final iterate
    xd = xt.detach().numpy()
    XD = np.copy(x)
    XD[0] = xd
    phiD = map_numpy(XD, np.array(W))
    phiD = phiD.flatten()
    D0 = phiD.transpose() @ theta
    D1 = phiD.transpose() @ theta1
    t0 = phi.transpose() @ theta
    t1 = phi.transpose() @ theta1
    return dict(t0=float(t0), t1=float(t1), D0=float(D0), D1=float(D1))


def run_quietly(fn, *args, **kwargs):
    """fn(*args, **kwargs) with stdout sent to os.devnull (their per-step progress lines)."""
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
        return fn(*args, **kwargs)
