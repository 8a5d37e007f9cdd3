"""The Delta-attack benchmark's results page (attack_speed.md) and printed table: the sides, their agreement."""

from __future__ import annotations

from pathlib import Path

from benchmarks.authors_gen import AUTHORS_COMMIT, how_to_get
from benchmarks.floor import Rates, floor_section, per_unit
from wslight.records.pages import PageHeader, write_page

# ----------------------------------------------------------------------------------------------------------------------
# The results page (attack_speed.md)
# ----------------------------------------------------------------------------------------------------------------------

PROTOCOL = (
    "The paper's protocol: every trial has its own random map and its own training set, the same on every side. The "
    "package attacks all trials in one call of `delta_attack` with `FreshMaps(map, seeds)` (closed-form heads in N x N "
    "space, token-move features, batched trials and restarts). The authors' code is their utils.py from their public "
    f"repository (commit {AUTHORS_COMMIT}) called as their gen.py calls it, one trial at a time "
    "(benchmarks/authors_gen.py; docs/theory/attack.md §6.5: numpy features, np.linalg.pinv, the dense D x D "
    "projector, "
    "fixed-step projected descent in torch); the torch port is an earlier re-implementation of that procedure. Times "
    "cover everything after drawing the data; peak memory is each side's own process (ru_maxrss); numpy's and "
    "torch's BLAS use the same number of threads on every side."
)
SIDES = {"authors": "the authors' code (gen.py, utils.py)", "port": "torch port of their procedure", "ours": "package"}


def side_row(name: str, res: dict, trials: int, ours: dict) -> str:
    """One side as a row of the page's table: time, per trial, peak memory, mean err, mean y*D1, the package's ratio."""
    errs = [r["err"] for r in res["trials"]]
    yD1 = [r["y"] * r["D1"] for r in res["trials"]]
    return (
        f"| {name} | {res['time_s']:.2f} s | {res['time_s'] / trials:.3f} s | {res['cpu_s'] / trials:.3f} s "
        f"| {res['peak_gib']:.2f} GiB | {sum(errs) / len(errs):.2e} | {sum(yD1) / len(yD1):+.3f} "
        f"| {res['time_s'] / ours['time_s']:.1f}x | {res['cpu_s'] / ours['cpu_s']:.1f}x |"
    )


def agreement(sides: dict) -> list[str]:
    """Lines on how the sides agree: closed forms (authors vs the package's on the same features), err and signs."""
    ours, lines = sides["ours"]["trials"], []
    if "authors" in sides:
        theirs = sides["authors"]["trials"]
        dt0 = max(abs(r["t0"] - r["pkg_t0"]) for r in theirs)
        dt1 = max(abs(r["t1"] - r["pkg_t1"]) for r in theirs)
        dt0_run = max(abs(r["t0"] - o["t0"]) for r, o in zip(theirs, ours, strict=True))
        lines.append(
            f"closed forms: the authors' t0, t1 against the package's `fit_heads` on the same float64 features: max "
            f"|dt0| {dt0:.1e}, |dt1| {dt1:.1e}; against the timed package run (float32 map, features cast): max "
            f"|dt0| {dt0_run:.1e}"
        )
    for key, res in sides.items():
        if key == "ours":
            continue
        worse = sum(o["err"] > r["err"] + 1e-6 for r, o in zip(res["trials"], ours, strict=True))
        flips = sum((r["y"] * r["D1"] < 0) == (o["y"] * o["D1"] < 0) for r, o in zip(res["trials"], ours, strict=True))
        lines.append(
            f"{SIDES[key]}: the package's err above it (by more than 1e-6) in {worse} of {len(ours)} trials; the same "
            f"flip (sign of y D1) in {flips} of {len(ours)}"
        )
    return lines


def attack_floor(ours: dict, trials: int, rates: Rates) -> list[str]:
    """The package's side against the machine's floor, and where its time goes."""
    row = ("the package's attack", per_unit(ours["flops"], trials), ours["time_s"] / trials, ours["threads"])
    return floor_section([row], rates, [("the package's attack", ours["shares"])])


def write_attack_page(
    folder, sides: dict, largest: dict | None, data: str, a, command: list[str], rates: Rates
) -> Path:
    """Write attack_speed.md: the header (wslight.records.pages, `command` as typed), the protocol, the tables."""
    ours = sides["ours"]
    body = [
        PROTOCOL,
        "",
        f"The cell: {a.map}, d = {a.d}, n = {a.n}, N = {a.N}, {a.training}, loss err, {a.trials} trials; data: {data}; "
        f"{ours['threads']} thread(s) per side; seed {a.seed}.",
        "",
        "| side | time | per trial | CPU per trial | peak memory | mean err | mean y*D1 | time / package's "
        "| CPU / package's |",
        "|---|---|---|---|---|---|---|---|---|",
        *(side_row(SIDES[k], res, a.trials, ours) for k, res in sides.items()),
        "",
        *(f"- {line}" for line in agreement(sides)),
        "",
    ]
    body += attack_floor(ours, a.trials, rates)
    if "authors" not in sides:
        body += [f"No row of the authors' code: {how_to_get(Path(a.authors_code))}.", ""]
    if largest is not None:
        errs = ", ".join(f"{r['err']:.2e}" for r in largest["trials"])
        body += [
            "## The paper's largest cell (RAF, d = 768, n = 120, N = 1300, re-trained; synthetic rows; package only)",
            "",
            f"{len(largest['trials'])} trial(s): {largest['time_s']:.1f} s, peak {largest['peak_gib']:.2f} GiB, "
            f"err {errs}.",
            "",
        ]
    return write_page(folder / "attack_speed.md", "Attack speed", PageHeader.collect(command), body)


def print_sides(sides: dict, a) -> None:
    """The comparison table and the per-trial errors on stdout."""
    ours = sides["ours"]
    print(f"threads per part: {ours['threads']}; own map and training set per trial, the same on every side")
    head = f"{'':8s} {'time (s)':>9s} {'s/trial':>8s} {'CPU s/tr':>8s} {'peak (GiB)':>10s} {'mean err':>9s}"
    print(head + f" {'mean y*D1':>9s} {'ratio':>7s} {'CPU ratio':>9s}")
    for name, res in sides.items():
        errs = [r["err"] for r in res["trials"]]
        yD1 = [r["y"] * r["D1"] for r in res["trials"]]
        mean_err, mean_yD1 = sum(errs) / len(errs), sum(yD1) / len(yD1)
        per, ratio = res["time_s"] / a.trials, res["time_s"] / ours["time_s"]
        cpu, cpu_ratio = res["cpu_s"] / a.trials, res["cpu_s"] / ours["cpu_s"]
        print(
            f"{name:8s} {res['time_s']:9.2f} {per:8.3f} {cpu:8.3f} {res['peak_gib']:10.2f} {mean_err:9.2e} "
            f"{mean_yD1:9.3f} {ratio:6.1f}x {cpu_ratio:8.1f}x"
        )
    names = [k for k in sides if k != "ours"]
    print(f"{'trial':>5s} " + " ".join(f"{'err ' + k:>12s}" for k in [*names, "ours"]) + f" {'steps':>6s}")
    for t in range(a.trials):
        errs = " ".join(f"{sides[k]['trials'][t]['err']:12.2e}" for k in [*names, "ours"])
        print(f"{t:5d} {errs} {int(ours['trials'][t]['steps']):6d}")
    for line in agreement(sides):
        print(line)
