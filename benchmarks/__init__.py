"""The benchmarks: each module runs from the repository root as `python -m benchmarks.<name>` (benchmarks/README.md).

Not part of the wslight package (pyproject.toml lists wslight's packages alone): they measure it against its
references and write their results pages (wslight.records.pages) beside their printed tables.
"""
