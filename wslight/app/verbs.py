"""The `wslight` command: one table of verbs behind `wslight`, `python -m wslight`, train.py and evaluate.py.

    wslight fit --config raf              train a linear head (LightningCLI `fit`; also validate, test)
    wslight evaluate --config ws/raf      run the evaluation a config describes (= python evaluate.py --config ...)
    wslight reproduce                     the reproduction plan and its report (= make reproduce)

`main` returns the exit status (0 when the run did what it was asked), so the console script, `python -m wslight`
and the two scripts all exit with it; a mistake exits 2 with one block on stderr, an interrupted run 130.
"""

from __future__ import annotations

import difflib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

from . import interrupts
from .errors import EXIT_SIGNAL_BASE


@dataclass(frozen=True)
class Verb:
    """One verb of the `wslight` command.

    Attributes:
        help: the one line `wslight --help` shows for it.
        run: (arguments after the verb, program name for messages) -> exit status (None: 0).
    """

    help: str
    # (arguments after the verb, program name for messages) -> exit status (None: 0)
    run: Callable[[list[str], str], int | None]


def _usage_mistake(err: Exception, prog: str) -> int:
    print(f"{prog}: error: {err}", file=sys.stderr)
    return 2


def _lightning(subcommand: str) -> Callable[[list[str], str], int | None]:
    def run(args: list[str], prog: str) -> int | None:
        from .cli import main as cli_main
        from .errors import UsageError
        from .help import lightning_args

        try:
            args = lightning_args(args)  # --help-all, --model.help <short class name>
        except UsageError as err:
            return _usage_mistake(err, prog)
        cli_main([subcommand, *args], prog=prog)
        return None

    return run


def _evaluate(args: list[str], prog: str) -> int | None:
    from .cli import main as cli_main
    from .errors import UsageError
    from .help import asks_for_help, evaluate_help, lightning_args

    try:
        if asks_for_help(args):  # the evaluation's own options, not Lightning's `test` help (that is --help-all)
            print(evaluate_help(args, prog))
            return 0
        args = lightning_args(args)
    except UsageError as err:
        return _usage_mistake(err, prog)
    # the command line itself: Lightning may run it again for the other processes of a CPU evaluation
    cli_main(["test", *args], evaluate=True, prog=prog, every_core=True)
    return None


def _reproduce(args: list[str], prog: str) -> None:
    from .reproduce import main as reproduce_main

    reproduce_main(args, prog=prog)


VERBS: dict[str, Verb] = {
    "fit": Verb("train a linear head on a frozen feature map, then test it (a training config)", _lightning("fit")),
    "validate": Verb("validate a head (a training config and --ckpt_path)", _lightning("validate")),
    "test": Verb("test a head (a training config and --ckpt_path)", _lightning("test")),
    "evaluate": Verb("run an evaluation config: word sensitivity, the attack, the probes", _evaluate),
    "reproduce": Verb("run the reproduction plan (configs/reproduce/plan.yaml) and write its report", _reproduce),
}


def usage(prog: str) -> str:
    """The usage block of `wslight`: the verbs and their one-line help."""
    width = max(map(len, VERBS))
    lines = [f"usage: {prog} <verb> [options]   ({prog} <verb> --help: the options of a verb)", "", "verbs:"]
    lines += [f"  {name:<{width}}  {verb.help}" for name, verb in VERBS.items()]
    lines += ["", "configs by name from any directory: --config raf, --config ws/raf, --config attack/fig4"]
    return "\n".join(lines)


def main(argv: list[str] | None = None, prog: str = "wslight") -> int:
    """Run `<verb> [options]` and return its exit status (0 on success).

    A mistake raises SystemExit(2) after one block on stderr; an interrupted run SystemExit(130) for SIGINT and
    SystemExit(143) for SIGTERM (wslight.app.errors).
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage(prog), file=sys.stdout if args else sys.stderr)
        return 0 if args else 2
    verb = args[0]
    if verb not in VERBS:
        close = difflib.get_close_matches(verb, VERBS, n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        print(f"{prog}: error: unknown verb {verb!r}{hint} (verbs: {', '.join(VERBS)})", file=sys.stderr)
        print(f"(every verb: {prog} --help)", file=sys.stderr)
        return 2
    return run_verb(verb, args[1:], f"{prog} {verb}", program=argv is None)


def run_verb(verb: str, args: list[str], prog: str, program: bool = False) -> int:
    """Run one verb of the table with its arguments; `prog` names the command in messages and usage lines.

    SIGINT and SIGTERM stop it from here on, before torch and Lightning are imported (wslight.app.interrupts): 130 or
    143, the verb's message once, also in a process Lightning's launcher starts for a DDP run. `program=True` (the
    process is the command: the console script, `python -m wslight`, train.py, evaluate.py): a signal after the verb,
    during the interpreter's exit, ends the process at once with its status.
    """
    interrupts.stop_on_signals(_interrupt_message(verb, prog))
    interrupts.end_with_launcher()
    try:
        return VERBS[verb].run(args, prog) or 0
    except BrokenPipeError:  # `wslight reproduce --list | head`: the reader left, which is no failure of the verb
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's flush at exit would raise again
        return 0
    except KeyboardInterrupt as stop:  # before the verb handles signals itself (its imports) or after it has
        interrupts.say_once()
        signum = getattr(stop, "signum", None)  # wslight reproduce's own Interrupted
        return EXIT_SIGNAL_BASE + signum if signum else interrupts.status()
    finally:
        if program:
            interrupts.exit_on_signals()


def _interrupt_message(verb: str, prog: str) -> str | None:
    """What rank 0 prints when a signal stops the verb (a training run: nothing but Lightning's own line)."""
    if verb == "evaluate":
        return interrupts.RESUME_HINT
    if verb == "reproduce":
        return f"{prog}: interrupted: the finished stages and trials are saved; run the same command again to resume"
    return None
