"""The run-level numbers of a classifier's one-word evaluation, and its summary.md.

From the records of `wslight.tasks.ClassifierWords`: one per position (kind "position") and one per review (kind
"review"). Per run: clean accuracy; one-word robust accuracy (the share of reviews correct and with no flipping
position); attack success (the share of the correctly classified reviews that some position flips); the share of
positions flipped and certified; words checked per position; the most frequent flipping words; the seconds a review.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from .summary import write_summary

CLASSIFIER_WORDS_REQUIRED = ("kind", "status")


def classifier_table(records: list[dict]) -> dict:
    """The run's row of summary.md (see the module docstring)."""
    reviews = [r for r in records if r["kind"] == "review"]
    positions = [r for r in records if r["kind"] == "position"]
    correct = [r for r in reviews if r["status"] != "wrong"]
    attacked = [r for r in correct if r["status"] == "attacked"]
    n, p = max(1, len(reviews)), max(1, len(positions))
    seconds = sum(r.get("seconds", 0.0) for r in reviews)
    return {
        "reviews": len(reviews),
        "clean_accuracy": len(correct) / n,
        "robust_accuracy": (len(correct) - len(attacked)) / n,
        "attack_success": len(attacked) / max(1, len(correct)),
        "positions": len(positions),
        "flip_rate": sum(r["status"] == "flipped" for r in positions) / p,
        "certified": sum(r["status"] == "certified" for r in positions) / p,
        "words_per_position": sum(r["checked"] for r in positions) / p,
        "forwards_per_s": sum(r.get("forwards", 0) for r in reviews) / seconds if seconds else float("nan"),
        "s_per_review": seconds / n,
    }


def screen_recall(records: list[dict]) -> dict | None:
    """The screen against the whole vocabulary on the positions checked both ways (None: none was).

    Returns:
        positions compared, positions some word flips (whole vocabulary), of those the screen found flipped
        (recall), and how often the screen's strongest word is the whole vocabulary's.
    """
    both = [r for r in records if r["kind"] == "position" and r.get("exhaustive_flips") is not None]
    if not both:
        return None
    flippable = [r for r in both if r["exhaustive_flips"] > 0]
    found = [r for r in flippable if r["flipped"]]
    same = [r for r in flippable if r["best_word"] == r["exhaustive_best_word"]]
    return {
        "positions": len(both),
        "flippable": len(flippable),
        "found": len(found),
        "recall": len(found) / len(flippable) if flippable else float("nan"),
        "same_strongest": len(same) / len(flippable) if flippable else float("nan"),
    }


def flipping_words(records: list[dict], top: int = 20) -> list[tuple[str, int]]:
    """The words that are the strongest flip at the most positions, with those counts."""
    return Counter(r["flip_word"] for r in records if r["kind"] == "position" and r["flipped"]).most_common(top)


def write_classifier_summary(records: list[dict], out_dir: Path, description: str, write: bool = True) -> dict:
    """The run's table (returned); with `write`, summary.md beside results.jsonl."""
    table = classifier_table(records)
    if not write:
        return table
    words = ", ".join(f"`{w}` ({c})" for w, c in flipping_words(records)) or "none"
    recall = screen_recall(records)
    after = f"\nThe most frequent flipping words (positions where each is the strongest): {words}\n"
    if recall is not None:
        after += (
            f"\nThe screen against the whole vocabulary on {recall['positions']} positions: some word flips "
            f"{recall['flippable']}; the screen found {recall['found']} of them (recall {recall['recall']:.3f}); its "
            f"strongest word is the whole vocabulary's at {recall['same_strongest']:.3f} of them.\n"
        )
    write_summary(
        out_dir,
        [table],
        caption=f"{description}\n\nclean_accuracy, the share of reviews classified correctly; robust_accuracy, "
        "correctly and with no position that one word flips; attack_success, the share of the correct reviews that "
        "one word flips; flip_rate and certified, the shares of positions where a candidate flips the label and "
        "where none does (over the whole candidate set); words_per_position, the candidates checked exactly.\n\n",
        after=after,
    )
    return table
