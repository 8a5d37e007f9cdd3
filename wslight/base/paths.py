"""Path settings as a shell would read them: `~` and `~user` expanded, once, in one place.

A config is YAML, not a shell command: `output_dir: ~/runs` reaches Python as the text `~/runs`, and a `Path` of it
names a folder called `~` in the working directory. Every path setting of the package (an evaluation's
`output_dir`, a trained run's `run`, a probe's `text_file`, the embeddings' `cache_dir` and `$WSLIGHT_CACHE`, an
encoder folder) goes through `user_path`. Lightning expands its own (`trainer.default_root_dir`, a logger's
`save_dir`, a checkpoint's `dirpath`).
"""

from __future__ import annotations

import os
from typing import overload


@overload
def user_path(value: None) -> None: ...


@overload
def user_path(value: str | os.PathLike[str]) -> str: ...


def user_path(value: str | os.PathLike[str] | None) -> str | None:
    """`value` with a leading `~` or `~user` expanded to that home folder (`os.path.expanduser`); None stays None.

    Anything else is kept as given: a relative path stays relative (to the working directory), a remote URL
    (`s3://...`) untouched.
    """
    if value is None:
        return None
    return os.path.expanduser(os.fspath(value))
