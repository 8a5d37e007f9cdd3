"""The two errors the command line turns into one short block on stderr with exit status 2."""


class UsageError(Exception):
    """A mistake in the command or its config: printed as one short block on stderr, exit status 2."""


class ParseError(Exception):
    """jsonargparse's parse error, raised instead of printing usage and exiting (main() formats it)."""
