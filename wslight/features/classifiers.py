"""Text classifiers as the one-word evaluation reads them: logits of token ids, and the input embedding table.

- `SequenceClassifier`: any Hugging Face `AutoModelForSequenceClassification` (binary or multi-class) with its
  tokenizer: a folder written by `save_pretrained` (the fine-tuning of `train.py` writes one), a hub id, or a
  `train.py` run folder holding one.
- `PromptClassifier`: a causal language model asked a question about the text through a template, whose decision is
  the logit of one answer token against another (the paper's Figure 1, right: a chat model's Yes/No on a review).

Both give `logits(input_ids (B, T)) -> (B, C)` and `embeddings()` (V, H), and render a text into the input string
with the span of characters the review occupies, so the words evaluation treats them alike (docs/tasks/classifier.md).
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from torch import Tensor, nn

from ..base.paths import user_path

# Inside a train.py run folder: the Hugging Face export of the fine-tuned model (wslight.tasks.finetune.EXPORT_DIR).
RUN_EXPORT = "huggingface"


def model_folder(name: str) -> str:
    """What `from_pretrained` loads for `name`: a run's Hugging Face export, a folder, or a hub id.

    Raises:
        ValueError: a folder that holds neither a config.json nor a run's export; naming what it has.
        HubUnreachableError: a hub id not in the local cache while the hub is unreachable (within seconds).
    """
    from ..data.encoders import encoder_info, resolve_encoder

    path = Path(user_path(name) or name)
    if path.is_dir():
        if (path / RUN_EXPORT / "config.json").is_file():
            return str(path / RUN_EXPORT)
        if (path / "config.json").is_file():
            return str(path)
        found = sorted(p.name for p in path.iterdir())[:8]
        raise ValueError(
            f"model: {name!r} is a folder without a config.json or a {RUN_EXPORT}/ export of train.py (it holds "
            f"{found}); give a folder written by save_pretrained, a train.py run of configs/finetune/imdb.yaml, or a "
            "hub id"
        )
    return encoder_info(resolve_encoder(name)).path  # a hub id: fails fast when it needs the unreachable hub


class SequenceClassifier(nn.Module):
    """A Hugging Face sequence classifier and its tokenizer.

    Args:
        model: a folder written by `save_pretrained`, a train.py run folder holding one, or a hub id.
        max_length: tokens read per text, specials included (None: the tokenizer's and the model's limit).
    """

    add_special_tokens = True

    def __init__(self, model: str, max_length: int | None = None) -> None:
        super().__init__()
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.name = model
        self.path = model_folder(model)
        self.model = AutoModelForSequenceClassification.from_pretrained(self.path).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(self.path)
        limit = min(
            int(self.tokenizer.model_max_length), getattr(self.model.config, "max_position_embeddings", 1 << 30)
        )
        self.max_length = max_length if max_length is not None else limit
        self.labels = [str(self.model.config.id2label[i]) for i in range(self.model.config.num_labels)]

    def render(self, text: str) -> tuple[str, tuple[int, int]]:
        """The model's input string for `text` (the text itself) and the characters of the text in it."""
        return text, (0, len(text))

    def embeddings(self) -> Tensor:
        """(V, H) the input embedding table (on the model's device)."""
        return self.model.get_input_embeddings().weight

    def logits(self, input_ids: Tensor | None = None, inputs_embeds: Tensor | None = None) -> Tensor:
        """(B, C) class logits of (B, T) ids, or of (B, T, H) input embeddings (no padding: one text's variants).

        Inputs move to the model's device; the logits come back on the CPU.
        """
        input_ids, inputs_embeds = _on(self.model, input_ids), _on(self.model, inputs_embeds)
        return self.model(input_ids=input_ids, inputs_embeds=inputs_embeds).logits.cpu()


class PromptClassifier(nn.Module):
    """A causal language model as a classifier: a template around the text, and the logits of answer tokens.

    The decision between classes is the next-token logit of each answer after the prompt (the paper's Figure 1,
    right: logit(Yes) - logit(No) of a chat model asked whether a review is positive); class c is `answers[c]`.

    Args:
        model: a causal LM folder or hub id (`AutoModelForCausalLM`); or an nn.Module built elsewhere (tests).
        template: the prompt, with `{text}` where the review goes.
        answers: one answer per class, each a single token of the tokenizer (class 0 first: IMDb's negative).
        tokenizer: the tokenizer folder or hub id (None: the model's).
        max_length: tokens read per prompt (None: no cut; the review must fit the model's context).
    """

    add_special_tokens = True

    def __init__(
        self,
        model: str | nn.Module,
        template: str = "Review: {text}\nIs this review positive? Answer:",
        answers: tuple[str, ...] = (" No", " Yes"),
        tokenizer: str | None = None,
        max_length: int | None = None,
    ) -> None:
        super().__init__()
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if template.count("{text}") != 1:
            raise ValueError(f"template must hold {{text}} exactly once, got {template!r}")
        if isinstance(model, nn.Module):
            self.name, self.model = type(model).__name__, model.eval()
            if tokenizer is None:
                raise ValueError("tokenizer: a model given as a module needs its tokenizer's folder or hub id")
        else:
            self.name = model
            self.model = AutoModelForCausalLM.from_pretrained(model_folder(model)).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(model_folder(tokenizer or str(model)))
        self.template = template
        self.max_length = max_length
        self.answer_ids = [self._answer_id(a) for a in answers]
        self.labels = [a.strip() for a in answers]

    def _answer_id(self, answer: str) -> int:
        ids = self.tokenizer(answer, add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            raise ValueError(f"answers: {answer!r} must be one token of the tokenizer, it is {len(ids)}: {ids}")
        return int(ids[0])

    def render(self, text: str) -> tuple[str, tuple[int, int]]:
        """The prompt with `text` inside, and the characters of the text in it."""
        start = self.template.index("{text}")
        return self.template.replace("{text}", text), (start, start + len(text))

    def embeddings(self) -> Tensor:
        """(V, H) the input embedding table (on the model's device)."""
        return self.model.get_input_embeddings().weight  # type: ignore[operator]  # an nn.Module attribute

    def logits(self, input_ids: Tensor | None = None, inputs_embeds: Tensor | None = None) -> Tensor:
        """(B, C) the answers' next-token logits after the prompt: (B, T, vocab) -> last position -> answer columns."""
        input_ids, inputs_embeds = _on(self.model, input_ids), _on(self.model, inputs_embeds)
        out = self.model(input_ids=input_ids, inputs_embeds=inputs_embeds).logits  # (B, T, vocab)
        return out[:, -1, self.answer_ids].cpu()  # (B, C)


TextClassifier = SequenceClassifier | PromptClassifier


def _on(model: nn.Module, x: Tensor | None) -> Tensor | None:
    """`x` on the device of the model's weights (None stays None)."""
    return None if x is None else x.to(next(model.parameters()).device)


def float64_copy(classifier: TextClassifier) -> TextClassifier:
    """The classifier with float64 weights (a copy; the tokenizer shared), for re-checking words rounding decides."""
    tokenizer = classifier.tokenizer
    classifier.tokenizer = None  # type: ignore[assignment]  # deep-copied once is enough: it is read-only here
    try:
        twin = copy.deepcopy(classifier)
    finally:
        classifier.tokenizer = tokenizer
    twin.tokenizer = tokenizer
    return twin.double()


@torch.no_grad()
def clean_logits(classifier: TextClassifier, ids: Tensor) -> Tensor:
    """(C,) the logits of one text's (T,) ids."""
    return classifier.logits(input_ids=ids[None])[0]


def forward_flops(config: object, tokens: int) -> float:
    """FLOPs of one forward of a BERT-style encoder over `tokens` tokens (a multiply-add counts 2).

    Per token and layer: the four H x H projections (8 H^2), the feed-forward's two H x I products (4 H I), the
    scores and the mixing (4 T H). The embeddings' lookups, LayerNorms, softmax and the head are left out (under 1%).
    """
    H = int(config.hidden_size)  # type: ignore[attr-defined]  # a transformers config
    L = int(config.num_hidden_layers)  # type: ignore[attr-defined]
    Inter = int(getattr(config, "intermediate_size", 4 * H))
    return float(L * tokens * (8 * H * H + 4 * H * Inter + 4 * tokens * H))
