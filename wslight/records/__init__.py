"""Records (plain Python, no torch, no Lightning).

results.jsonl (`results`), summaries of records (`summary`) and the paper's checks computed from them (`paper_checks`).
"""
