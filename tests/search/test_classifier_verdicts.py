"""The exact one-word check of a text classifier against a brute-force loop through the Hugging Face model.

The loop writes each candidate into the text, tokenises the edited text again and runs the model in float64; the
batched check (float32 forwards, float64 re-check of the words rounding could decide) must find the same flips, the
same strongest word and its margin, at every position, for a sequence classifier and a prompt classifier.
"""

from __future__ import annotations

import pytest
import torch
from tiny_classifiers import tiny_bert_classifier, tiny_causal_lm

from wslight.data.word_positions import retokenised, tokenise, word_vocabulary
from wslight.features.classifiers import PromptClassifier, SequenceClassifier, float64_copy
from wslight.search.candidates import NeighbourIndex, first_order_ranking
from wslight.search.classifier_words import PositionWords, margin_gradients, margins, review_verdicts

pytestmark = pytest.mark.usefixtures("one_thread")

TEXT = "The plot was dull and the acting worse, yet the music is lovely and I smiled twice."


@pytest.fixture(scope="module")
def sequence(tmp_path_factory):
    """A tiny BERT classifier whose bias puts TEXT just on one side of the boundary (so some words flip it)."""
    clf = SequenceClassifier(str(tiny_bert_classifier(tmp_path_factory.mktemp("bert"))))
    ids = clf.tokenizer(TEXT, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = clf.logits(input_ids=ids)[0]
        clf.model.classifier.bias[1] += float(logits[0] - logits[1]) + 2e-4  # class 1 ahead by 2e-4
    return clf


@pytest.fixture(scope="module")
def prompt(tmp_path_factory):
    """A tiny Llama asked about TEXT, its two answers' output rows set so that "yes" leads "no" by 2e-4 there."""
    folder = tiny_causal_lm(tmp_path_factory.mktemp("llama"))
    clf = PromptClassifier(str(folder), template="Review: {text} Positive?", answers=(" no", " yes"))
    text, _ = clf.render(TEXT)
    ids = clf.tokenizer(text, return_tensors="pt")["input_ids"]
    no, yes = clf.answer_ids
    with torch.no_grad():
        h = clf.model(input_ids=ids, output_hidden_states=True).hidden_states[-1][0, -1]  # (H,) after the final norm
        W = clf.model.lm_head.weight
        delta = W[yes] - W[no]
        W[yes] += (2e-4 - float(delta @ h)) * h / float(h @ h)  # (W_yes - W_no) . h = 2e-4
        logits = clf.logits(input_ids=ids)[0]
    assert float(logits[1] - logits[0]) == pytest.approx(2e-4, abs=1e-5)
    return clf


def candidates(clf, tokens, k=25):
    vocab_ids, vocab_words = word_vocabulary(clf.tokenizer)
    index = dict(zip(vocab_ids.tolist(), vocab_words, strict=True))
    near = NeighbourIndex(clf.embeddings(), vocab_ids)
    out = []
    for p in tokens.positions:
        ids = near.nearest(int(tokens.ids[p.token]), k)
        words = [index[int(i)] for i in ids]
        ok = retokenised(clf.tokenizer, tokens, p, words, None, True, ids)
        out.append(PositionWords(p.token, ids[ok], [w for w, o in zip(words, ok.tolist(), strict=True) if o]))
    return out


def brute_force(clf64, tokens, position, words):
    """(margins, labels) of each word written into the text, re-tokenised, through the float64 model."""
    text = tokens.text
    clean = clf64.logits(input_ids=clf64.tokenizer(text, return_tensors="pt")["input_ids"])[0]
    label = int(clean.argmax())
    out = []
    for w in words:
        edited = text[: position.start] + w + text[position.end :]
        ids = clf64.tokenizer(edited, return_tensors="pt")["input_ids"]
        logits = clf64.logits(input_ids=ids)
        out.append(float(margins(logits, label)[0]))
    return out


@pytest.mark.parametrize("which", ["sequence", "prompt"])
def test_verdicts_equal_a_brute_force_loop(which, request):
    clf = request.getfixturevalue(which)
    clf64 = float64_copy(clf)
    text, span = clf.render(TEXT)
    tokens = tokenise(clf.tokenizer, text, None, span)
    cands = candidates(clf, tokens)
    with torch.no_grad():
        clean, verdicts = review_verdicts(clf.logits, tokens.ids, cands, batch=16, logits64_of=clf64.logits)
        total_flips = 0
        for p, c, v in zip(tokens.positions, cands, verdicts, strict=True):
            m = brute_force(clf64, tokens, p, c.words)
            flips = sum(x < 0 for x in m)
            total_flips += flips
            assert v.checked == len(c.words)
            assert v.flips == flips, (p.word, m)
            best = min(range(len(m)), key=m.__getitem__)
            assert v.best_word == c.words[best]
            assert v.best_margin == pytest.approx(m[best], abs=1e-9)
    assert total_flips > 0  # the test exercises flips, not only their absence


def test_float64_recheck_decides_words_near_the_boundary(sequence):
    """Without the re-check the float32 margins differ from float64's by rounding; with it they agree to 1e-9."""
    clf64 = float64_copy(sequence)
    tokens = tokenise(sequence.tokenizer, TEXT, None)
    cands = candidates(sequence, tokens, k=10)[:4]
    with torch.no_grad():
        _, f32 = review_verdicts(sequence.logits, tokens.ids, cands, 16, None)
        _, checked = review_verdicts(sequence.logits, tokens.ids, cands, 16, clf64.logits)
        _, f64 = review_verdicts(clf64.logits, tokens.ids, cands, 16, None)
    assert all(v.rechecked > 0 for v in checked)
    assert [v.best_margin for v in checked] == pytest.approx([v.best_margin for v in f64], abs=1e-9)
    assert max(abs(a.best_margin - b.best_margin) for a, b in zip(f32, f64, strict=True)) > 1e-12


def test_word_positions_skip_pieces_punctuation_and_the_cut():
    from tiny_classifiers import bundled_tokenizer

    tok = bundled_tokenizer()
    text = "Unwatchable, 10/10 xylophonists agree: it's bad."
    tokens = tokenise(tok, text, max_length=12)
    words = [p.word for p in tokens.positions]
    assert all(w.isalpha() for w in words)
    assert "xylophonists" not in words  # several pieces
    assert tokens.skipped["not letters"] >= 3  # ',', '10', '/', ...
    assert tokens.skipped["cut off"] > 0  # max_length 12 cuts the end
    for p in tokens.positions:
        assert text[p.start : p.end] == p.word and tok.convert_ids_to_tokens(int(tokens.ids[p.token])) == p.word.lower()


def test_retokenised_refuses_words_that_are_not_one_token_there():
    from tiny_classifiers import bundled_tokenizer

    tok = bundled_tokenizer()
    tokens = tokenise(tok, "a good film", None)
    p = tokens.positions[1]
    ok = retokenised(tok, tokens, p, ["great", "xylophonist", "good", "bad!"], None)
    assert ok.tolist() == [True, False, False, False]


def test_screen_ranks_by_the_margins_first_order_change(sequence):
    """The screen's ranking is the order of (E_w - E_x) . grad, and that is the margin's derivative along E_w - E_x."""
    clf = float64_copy(sequence)  # a finite difference of the margin: float64, rounding far below the step
    tokens = tokenise(clf.tokenizer, TEXT, None)
    table = clf.embeddings().detach()
    emb = table[tokens.ids]
    label = int(clf.logits(input_ids=tokens.ids[None])[0].argmax())
    margin, grad = margin_gradients(lambda e: clf.logits(inputs_embeds=e), emb, label)
    t = tokens.positions[2].token
    vocab_ids, _ = word_vocabulary(clf.tokenizer)
    top = first_order_ranking(table, int(tokens.ids[t]), grad[t], vocab_ids[:2000], 5)
    direction = table[top[0]] - emb[t]
    moved = emb.clone()
    moved[t] += 1e-5 * direction
    with torch.no_grad():
        after = float(margins(clf.logits(inputs_embeds=moved[None]), label)[0])
    assert (after - margin) / 1e-5 == pytest.approx(float(direction @ grad[t]), rel=1e-3)
    scores = (table[vocab_ids[:2000]] - emb[t]) @ grad[t]
    assert float(scores.min()) == pytest.approx(float(direction @ grad[t]), rel=1e-9)
    assert sorted(scores.topk(5, largest=False).indices.tolist()) == sorted(
        (vocab_ids[:2000][:, None] == top).nonzero()[:, 0].tolist()
    )
