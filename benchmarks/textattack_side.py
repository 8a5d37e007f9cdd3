"""TextAttack beside the package: the same candidate words, greedy search against the exhaustive check.

On the same Hugging Face classifier and the same held-out reviews, the package's `ClassifierWords` (candidates
"neighbours": the k nearest one-token words in the input-embedding space, every candidate at every replaceable word
checked exactly) and TextAttack (`GreedyWordSwapWIR`, word importance by [UNK] replacement, an untargeted
classification goal, `MaxWordsPerturbed(max_num_words=1)`) over the very same candidates: a `WordSwap` whose words at
a word are the package's candidates at that position, and a pre-transformation constraint that leaves TextAttack the
words the package can replace (a TextAttack word whose characters are exactly one package position). TextAttack reads
the model through `HuggingFaceModelWrapper`, its inputs cut at the package's `max_length` and padded to the longest of
a batch (the stock wrapper pads every text to the tokenizer's limit, 512 tokens: slower, and past a small model's
positions).

The package is exact over the set, greedy search is not: every review TextAttack attacks must be attacked by the
package (an exception is listed with its word and that word's float64 margin), while the package may find flips the
greedy order misses. Times are per review, one process, `--threads` torch threads; TextAttack's time is its
`Attack.attack` call alone (the candidate table it reads is built beforehand, from the package, and not counted).

TextAttack is not installed with the package (its requirements would replace this environment's transformers):

    python -m pip install --target /tmp/ta-site --no-deps textattack==0.3.11 <the modules its import needs: TA_DEPS>
    PYTHONPATH=/tmp/ta-site HF_HUB_OFFLINE=1 python -m benchmarks.textattack_side --model <HF folder> --reviews 20

Offline, `import textattack` needs two stand-ins, given here only while it imports: flair (its POS/NER tagger, imported
at import time; flair 0.15 requires transformers < 5) and NLTK's stopword list (read at import time by the
augmentation recipes). What needs downloads does not run: StopwordModification and WordNet (NLTK data), the
counter-fitted word embeddings (WordSwapEmbedding, from S3), the Universal Sentence Encoder (tensorflow_hub), POS
constraints (flair), hence no stock recipe (textfooler, pwws, ...). Writes textattack_side.md into --page.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import types
from importlib import metadata
from pathlib import Path

from benchmarks.common import ROOT, command_line

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TA_SITE = "/tmp/ta-site"
TA_DEPS = (
    "nltk joblib lru-dict Levenshtein rapidfuzz langdetect six pinyin OpenHowNet anytree lemminflect more-itertools "
    "num2words word2number language-tool-python psutil toml bert-score editdistance scipy terminaltables jieba"
)
INSTALL = f"python -m pip install --target {TA_SITE} --no-deps textattack==0.3.11 {TA_DEPS}"


def import_textattack() -> list[str]:
    """Import TextAttack offline; what had to stand in for it to import.

    Raises:
        SystemExit(2): TextAttack (or a module its import needs) is not importable; one line says how to install it.
    """
    notes = []
    try:
        import nltk
        import nltk.corpus

        try:
            import flair  # noqa: F401
        except Exception:  # missing, or flair 0.15 against transformers 5
            for name in [m for m in sys.modules if m == "flair" or m.startswith("flair.")]:
                del sys.modules[name]
            _stand_in_flair()
            notes.append("flair: a stand-in (Sentence and SequenceTagger raise when used)")
        saved = nltk.corpus.stopwords
        try:
            nltk.data.find("corpora/stopwords")
        except LookupError:
            nltk.corpus.stopwords = types.SimpleNamespace(words=lambda language="english": [])
            notes.append("NLTK stopwords: an empty list while textattack imports (its augmentation recipes read it)")
        try:
            import textattack  # noqa: F401
        finally:
            nltk.corpus.stopwords = saved
    except Exception as e:  # not installed, or an import that fails here
        why = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"
        print(
            f"benchmarks.textattack_side: TextAttack is not importable ({why}); install it with `{INSTALL}` and run "
            f"with PYTHONPATH={TA_SITE}",
            file=sys.stderr,
        )
        raise SystemExit(2) from None
    return notes


def _stand_in_flair() -> None:
    """`import flair` for TextAttack's module-level imports: its classes exist, using them raises."""

    class Unavailable:
        def __init__(self, *args, **kwargs):
            raise ImportError("flair is not installed (it needs transformers < 5): TextAttack's POS/NER tagging")

        @classmethod
        def load(cls, *args, **kwargs):
            cls()

    flair, data, models = (types.ModuleType(n) for n in ("flair", "flair.data", "flair.models"))
    data.Tokenizer, data.Sentence, models.SequenceTagger = object, Unavailable, Unavailable
    flair.data, flair.models = data, models
    sys.modules.update({"flair": flair, "flair.data": data, "flair.models": models})


def offline_checks() -> list[str]:
    """Which of TextAttack's parts that read local data run here (none of these is used by the comparison)."""
    from textattack.constraints.pre_transformation import StopwordModification
    from textattack.transformations import WordSwapWordNet

    out = []
    for name, build in (
        ("StopwordModification()", lambda: StopwordModification()),
        ("WordSwapWordNet()", lambda: WordSwapWordNet()._get_replacement_words("good")),
    ):
        try:
            build()
            out.append(f"{name}: runs")
        except Exception as e:
            said = [line.strip() for line in str(e).splitlines() if line.strip().strip("*")]
            out.append(f"{name}: fails ({type(e).__name__}: {(said or [''])[0][:90]})")
    return out


def word_spans(text: str, words: list[str]) -> list[tuple[int, int]]:
    """The characters of each of TextAttack's words in `text`, found in order as TextAttack finds them."""
    spans, cursor = [], 0
    for w in words:
        start = text.find(w, cursor)
        if start < 0:
            spans.append((-1, -1))
            continue
        spans.append((start, start + len(w)))
        cursor = start + len(w)
    return spans


def addressable(positions: list, spans: list[tuple[int, int]]) -> dict[int, object]:
    """{TextAttack word index: package position} for the words that are exactly one package position."""
    by_span = {(p.start, p.end): p for p in positions}
    return {i: by_span[s] for i, s in enumerate(spans) if s in by_span}


def attack_parts(model, tokenizer, max_length: int, batch: int, wir: str):
    """The goal function, and a function of a candidate table {word index: words} to the attack over it."""
    import torch
    from textattack import Attack
    from textattack.constraints import PreTransformationConstraint
    from textattack.constraints.overlap import MaxWordsPerturbed
    from textattack.constraints.pre_transformation import RepeatModification
    from textattack.goal_functions import UntargetedClassification
    from textattack.models.wrappers import HuggingFaceModelWrapper
    from textattack.search_methods import GreedyWordSwapWIR
    from textattack.transformations import WordSwap

    class CutWrapper(HuggingFaceModelWrapper):
        """The stock wrapper, its inputs cut at the package's max_length and padded to the batch's longest."""

        def __call__(self, texts):
            enc = self.tokenizer(list(texts), padding=True, truncation=True, max_length=max_length, return_tensors="pt")
            with torch.no_grad():
                return self.model(**enc).logits

    class TableSwap(WordSwap):
        """The package's candidates at each word it can replace (none elsewhere)."""

        def __init__(self, table: dict[int, list[str]]):
            super().__init__()
            self.table = table

        def _get_replacement_words(self, word):
            raise NotImplementedError("TableSwap's candidates depend on the position: see _get_transformations")

        def _get_transformations(self, current_text, indices_to_modify):
            return [current_text.replace_word_at_index(i, w) for i in indices_to_modify for w in self.table.get(i, [])]

    class InTable(PreTransformationConstraint):
        """Only the words that have candidates (the package's positions)."""

        def __init__(self, table: dict[int, list[str]]):
            self.table = table

        def _get_modifiable_indices(self, current_text):
            return set(self.table)

    goal = UntargetedClassification(CutWrapper(model, tokenizer), model_batch_size=batch)

    def build(table: dict[int, list[str]]):
        constraints = [RepeatModification(), InTable(table), MaxWordsPerturbed(max_num_words=1)]
        return Attack(goal, constraints, TableSwap(table), GreedyWordSwapWIR(wir_method=wir))

    return build


def versions() -> str:
    """The installed versions of TextAttack and the modules it was given."""
    names = ["textattack", "nltk", "scipy", "transformers", "torch", "flair"]
    found = []
    for n in names:
        try:
            found.append(f"{n} {metadata.version(n)}")
        except metadata.PackageNotFoundError:
            found.append(f"{n} not installed")
    return ", ".join(found)


def margin(logits, label: int) -> float:
    """logit[label] minus the largest other logit."""
    others = [float(x) for j, x in enumerate(logits) if j != label]
    return float(logits[label]) - max(others)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--model", required=True, help="a Hugging Face sequence classifier folder")
    parser.add_argument("--reviews", type=int, default=20, help="this many held-out reviews, from --first on")
    parser.add_argument("--first", type=int, default=0, help="the index of the first review")
    parser.add_argument("--k", type=int, default=10, help="neighbours per word")
    parser.add_argument("--wir", choices=("unk", "delete"), default="unk", help="TextAttack's word importance")
    parser.add_argument("--batch-size", type=int, default=64, help="texts per forward, both sides")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--page", type=Path, default=ROOT / "reports" / "textattack", help="where the page goes")
    args = parser.parse_args(argv)
    command = command_line(__file__, argv)
    stand_ins = import_textattack()

    import torch
    from textattack.shared import AttackedText

    from wslight.data.word_positions import tokenise
    from wslight.records.pages import PageHeader, write_page
    from wslight.tasks.classifier_words import ClassifierWords

    torch.set_num_threads(args.threads)
    cw = ClassifierWords(model=args.model, candidates="neighbours", k=args.k, num_reviews=args.first + args.reviews)
    clf = cw.classifier
    cw.vocabulary, cw.neighbours, cw.classifier64  # built once, before any review is timed  # noqa: B018
    build = attack_parts(clf.model, clf.tokenizer, cw.max_length, args.batch_size, args.wir)
    rows, head = [], "| review | label | package | flipped (TA-addressable) | positions (TA-addressable) |"
    head += " TextAttack | its swap (float64 margin) | package s | TextAttack s | forwards / queries |"
    lines = [head, "|" + "---|" * 10]
    print(head)
    for k in range(args.first, cw.num_reviews):
        text, label = cw.texts[k], int(cw.labels[k])
        rendered, span = clf.render(text)
        tokens = tokenise(clf.tokenizer, rendered, cw.max_length, span, clf.add_special_tokens)
        start = time.perf_counter()
        words = AttackedText(text).words
        mapped = addressable(tokens.positions, word_spans(text, words))
        table = {i: cw.position_words(tokens, p)[0].words for i, p in mapped.items()}
        table = {i: w for i, w in table.items() if w}
        table_s = time.perf_counter() - start
        with torch.no_grad():  # as under Lightning's test loop
            records = cw.review_records(k)
        review = records[-1]
        flipped = {r["position"] for r in records[:-1] if r["flipped"]}
        reach = {p.token for p in mapped.values()}
        attack = build(table)
        start = time.perf_counter()
        result = attack.attack(text, label)
        ta_s = time.perf_counter() - start
        outcome = type(result).__name__.replace("AttackResult", "").lower()
        swap, swap_flips, swap_margin, swap_same = "", None, None, None
        if outcome == "successful":
            orig, adv = result.original_result.attacked_text, result.perturbed_result.attacked_text
            (i,) = orig.all_words_diff(adv)
            adv_ids = tokenise(clf.tokenizer, adv.text, cw.max_length).ids
            with torch.no_grad():
                swap_margin = margin(cw.classifier64.logits(input_ids=adv_ids[None])[0], label)
            swap = f"{orig.words[i]} → {adv.words[i]} ({swap_margin:+.3g})"
            swap_flips = mapped[i].token in flipped
            p = mapped[i]
            swap_same = adv.text == text[: p.start] + adv.words[i] + text[p.end :]
        row = {
            "k": k,
            "status": review["status"],
            "outcome": outcome,
            "swap": swap,
            "swap_flips": swap_flips,
            "swap_same": swap_same,
            "package_s": review["seconds"],
            "ta_s": ta_s,
            "table_s": table_s,
            "flipped_reach": len(flipped & reach),
        }
        rows.append(row)
        line = (
            f"| {k} | {label} | {review['status']} | {len(flipped)} ({len(flipped & reach)}) | "
            f"{review['positions']} ({len(reach)}) | {outcome} | {swap} | {review['seconds']:.2f} | {ta_s:.2f} | "
            f"{review['forwards']} / {result.perturbed_result.num_queries} |"
        )
        lines.append(line)
        print(line)
    totals = summary(rows)
    print("\n".join(totals))
    body = page_body(args, cw, stand_ins, offline_checks(), lines, totals)
    title = "TextAttack beside the package: one word, the same neighbours"
    print(write_page(args.page / "textattack_side.md", title, PageHeader.collect(command), body))
    exceptions = [r for r in rows if r["outcome"] == "successful" and r["status"] != "attacked"]
    return 1 if exceptions else 0


def summary(rows: list[dict]) -> list[str]:
    """The totals: attack success of each side, the cross-check both ways, and the time per review."""
    n = len(rows)
    correct = [r for r in rows if r["status"] != "wrong"]
    attacked = [r for r in rows if r["status"] == "attacked"]
    success = [r for r in rows if r["outcome"] == "successful"]
    run = [r for r in rows if r["outcome"] != "skipped"]
    exceptions = [r for r in success if r["status"] != "attacked"]
    off_position = [r for r in success if not r["swap_flips"]]
    same = sum(bool(r["swap_same"]) for r in success)
    missed = [r for r in attacked if r["outcome"] != "successful"]
    missed_reach = [r for r in missed if r["flipped_reach"]]
    disagree = [r["k"] for r in rows if (r["status"] == "wrong") != (r["outcome"] == "skipped")]
    pkg, ta = (sum(r[key] for r in correct) / max(len(correct), 1) for key in ("package_s", "ta_s"))
    pkg_all, ta_all = (sum(r[key] for r in rows) / n for key in ("package_s", "ta_s"))
    table = sum(r["table_s"] for r in rows) / n
    listed = "; ".join(f"review {r['k']}: {r['swap']}" for r in exceptions) or "none"
    return [
        "",
        f"- reviews: {n}; misclassified before any swap: package {n - len(correct)} (wrong), TextAttack "
        f"{n - len(run)} (skipped)" + (f"; they disagree on reviews {disagree}" if disagree else ", the same reviews"),
        f"- attack success (of the correctly classified): package {len(attacked)}/{len(correct)}, TextAttack "
        f"{len(success)}/{len(run)}",
        f"- attacked by TextAttack but not by the package: **{len(exceptions)}** (must be 0): {listed}",
        f"- TextAttack's swap at a position the package does not find flipped: {len(off_position)}; its text the "
        f"package's edit of that position (the same ids but one): {same} of {len(success)}",
        f"- attacked by the package but not by TextAttack: {len(missed)} (of which {len(missed_reach)} with a flip "
        "at a word TextAttack could swap: the greedy order's misses; the others flip only at positions TextAttack's "
        "words do not match)",
        f"- mean seconds per correctly classified review (both sides search): package {pkg:.3f}, TextAttack "
        f"{ta:.3f} (TextAttack / package = {ta / max(pkg, 1e-9):.2f}x); over all {n} reviews: package {pkg_all:.3f}, "
        f"TextAttack {ta_all:.3f} (it skips a misclassified review, the package checks it too); building "
        f"TextAttack's candidate table, not counted: {table:.3f} s per review",
    ]


def page_body(args, cw, stand_ins: list[str], checks: list[str], lines: list[str], totals: list[str]) -> list[str]:
    """The page: what was compared, how TextAttack was installed and what of it ran offline, the tables."""
    return [
        f"{cw.describe()} TextAttack: `GreedyWordSwapWIR(wir_method={args.wir!r})`, "
        "`UntargetedClassification`, `RepeatModification`, `MaxWordsPerturbed(max_num_words=1)`, the package's "
        "candidates as a `WordSwap` over the words that are exactly one package position. Both sides "
        f"{args.batch_size} texts per forward, {args.threads} torch thread(s).",
        "",
        "With a one-word budget the greedy search ranks the words by how much replacing each with [UNK] lowers the "
        "true class's probability, then at the first word (in that order) whose best candidate raises its score it "
        "keeps that candidate: a success if it flips, else the search is over (every later swap would be a second "
        "word). The package checks every candidate at every position. TextAttack's time goes mostly to building "
        "candidate texts in Python (`AttackedText.generate_new_attacked_text`, one pass over the text per "
        "candidate), the later words' candidates included, built and then refused by the budget; the package's to "
        "the model's forwards.",
        "",
        "## TextAttack here",
        "",
        f"- installed into `{TA_SITE}` (not into the project's environment), run with `PYTHONPATH={TA_SITE}`:",
        f"  `{INSTALL}`",
        f"- versions: {versions()}",
        "- stand-ins while `import textattack` ran: " + ("; ".join(stand_ins) or "none"),
        "- offline, its first import tries to download NLTK data (fails, harmless: nothing used here reads it); "
        + "; ".join(checks)
        + "; WordSwapEmbedding (counter-fitted embeddings from S3): fails; UniversalSentenceEncoder: fails "
        "(tensorflow_hub); POS constraints: fail (flair); so no stock recipe (textfooler, pwws, ...) runs offline",
        "",
        "## Per review",
        "",
        "Package: robust / attacked / wrong; flipped positions (those TextAttack can address); TextAttack: successful "
        "/ failed / skipped; forwards: the package's texts evaluated / TextAttack's model queries.",
        "",
        *lines,
        "",
        "## Totals",
        *totals,
    ]


if __name__ == "__main__":
    sys.exit(main())
