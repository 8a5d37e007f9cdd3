"""The base floor, imported by every other folder and importing nothing of the package.

`validate` (checks of settings that name their key), `seeding` (per-trial generators), `numerics` (fixed-chunk sums,
Gram matrices), `fingerprints` (file hashes of the cache), `names` (the words the whole package shares) and `paths`
(path settings with `~` expanded).
"""
