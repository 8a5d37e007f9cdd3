"""What a run does that its settings did not say is one line on stderr: repeated positions, an empty test split."""

from wslight.base.validate import repeated
from wslight.data.spec import EmbeddingSpec
from wslight.tasks import EmbeddingDataModule, GridSettings, HeadWordFlips, WordSensitivitySweep

SYNTHETIC = EmbeddingSpec(source="synthetic", num_samples=20, max_length=8, synthetic_dim=6)


def notes(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]


def test_repeated_names_each_value_given_more_than_once():
    assert repeated([1, 4, 1, 7, 4, 1]) == [1, 4] and repeated([1, 2]) == [] and repeated("all") == []


def test_repeated_positions_are_kept_once_with_a_note_naming_the_key_and_the_repeats(capsys):
    callback = HeadWordFlips(reviews=2, positions=[1, 4, 1, 7, 4])
    assert callback.positions == [1, 4, 7]
    assert notes(capsys) == ["note: positions repeats 1, 4 (given [1, 4, 1, 7, 4]): each is evaluated once"]
    WordSensitivitySweep(GridSettings(["rf"], [6], [4], trials=1), positions=[0, 2, 0], embeddings=SYNTHETIC)
    assert notes(capsys) == ["note: positions repeats 0 (given [0, 2, 0]): each is evaluated once"]
    HeadWordFlips(reviews=2, positions=[1, 4, 7])
    WordSensitivitySweep(GridSettings(["rf"], [6], [4], trials=1), positions="all", embeddings=SYNTHETIC)
    assert notes(capsys) == []


def test_a_fit_with_an_empty_test_split_says_it_logs_no_test_metrics(capsys):
    empty = EmbeddingDataModule(SYNTHETIC, n=8, d=6, val_fraction=0.2, test_fraction=0.0)
    empty.setup("fit")
    empty.setup("fit")  # once per data module
    assert notes(capsys) == [
        "note: data.test_fraction 0.0 leaves the test split empty (of 20 reviews): the fit logs no test/ metrics, "
        "and no evaluation of this run has held-out reviews"
    ]
    held_out = EmbeddingDataModule(SYNTHETIC, n=8, d=6, val_fraction=0.2, test_fraction=0.2)
    held_out.setup("fit")
    assert len(held_out.test_indices) == 4 and notes(capsys) == []
