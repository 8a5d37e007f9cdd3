"""The exit statuses of every wslight command, and the two errors the command line turns into one short block.

The block goes to stderr with exit status 2. A module with no heavy imports: `wslight reproduce --help` reads it without
Lightning.
"""

# 0 the run did what it was asked, 1 it failed (diverged, a map that raises, disk full), 2 a mistake in the command or
# config, 75 the run folder is busy (try again later, as sysexits' EX_TEMPFAIL), 128 + the signal when interrupted
# (resumable): 130 by SIGINT (Ctrl-C), 143 by SIGTERM, as a shell reports a process its signal ended.
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_BUSY = 75
EXIT_SIGNAL_BASE = 128


class UsageError(Exception):
    """A mistake in the command or its config: printed as one short block on stderr, exit status 2."""


class ParseError(Exception):
    """jsonargparse's parse error, raised instead of printing usage and exiting (main() formats it)."""
