"""`--shard i/N` on evaluate.py's command line: taken out before the config is parsed (docs/tasks/gpus.md, Shards).

The shard stays outside the config, so every shard of a run has the run's key and folder (`wslight.records.shards`).
"""

from __future__ import annotations

from ..records.shards import Shard, parse_shard
from .errors import UsageError


def take_shard(args: list[str], evaluate: bool) -> tuple[list[str], Shard | None]:
    """The arguments without `--shard i/N` (or `--shard=i/N`), and that shard (None when not given).

    The shard stays out of the parsed config: shards of one run share its run key and folder (wslight.records.shards).

    Raises:
        UsageError: a malformed or out-of-range value, `--shard` given twice or to a training run.
    """
    rest: list[str] = []
    given: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--shard":
            if i + 1 >= len(args) or args[i + 1].startswith("--"):
                raise UsageError("shard: --shard needs a value i/N (shard i of N, 0 <= i < N), e.g. --shard 0/3")
            given.append(args[i + 1])
            i += 2
            continue
        if arg.startswith("--shard="):
            given.append(arg.split("=", 1)[1])
        else:
            rest.append(arg)
        i += 1
    if not given:
        return rest, None
    if len(given) > 1:
        raise UsageError(f"shard: given {len(given)} times ({', '.join(given)}); give one --shard i/N")
    if not evaluate:
        raise UsageError(f"shard: {given[0]}: only an evaluation (evaluate.py) runs as shards; a fit has no trials")
    try:
        return rest, parse_shard(given[0])
    except ValueError as err:
        raise UsageError(str(err)) from None
