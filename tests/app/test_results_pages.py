"""`make results-pages`: the latest runs' pages and the figures they show, copied into docs/results/, or exit 2."""

import pytest

from wslight.app import results_pages


def write_run(reports, folder, pages):
    """A run's pages under reports/<folder>/, each showing one figure of its own that the folder holds."""
    for name in pages:
        figure = f"figures/{name.removesuffix('.md')}.png"
        (reports / folder / "figures").mkdir(parents=True, exist_ok=True)
        (reports / folder / figure).write_bytes(b"png of " + name.encode())
        (reports / folder / name).write_text(f"# {name}\n\n![plot]({figure})\n")


def test_a_missing_run_stops_the_copy_with_the_command_that_writes_it(tmp_path, capsys):
    write_run(tmp_path / "reports", "offline", ["reproduction.md"])
    argv = ["--reports", str(tmp_path / "reports"), "--docs", str(tmp_path / "docs")]
    with pytest.raises(SystemExit) as exc:
        results_pages.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("make results-pages: error: no `make bench` run to copy: ")
    assert f"{tmp_path / 'reports' / 'bench' / 'ws_speed.md'}" in err and "run `make bench` first" in err
    assert 'make results-pages RUNS="reproduce"' in err
    assert not (tmp_path / "docs").exists()  # nothing copied, not even the run that is there


def test_the_pages_and_their_figures_land_in_the_docs(tmp_path):
    reports, docs = tmp_path / "reports", tmp_path / "docs"
    write_run(reports, "offline", ["reproduction.md", "beyond_paper.md"])
    write_run(reports, "bench", ["ws_speed.md", "attack_speed.md"])
    (reports / "offline" / "figures" / "not_shown.png").write_bytes(b"")
    copied = results_pages.main(["--reports", str(reports), "--docs", str(docs)])
    pages = ["reproduction.md", "beyond_paper.md", "ws_speed.md", "attack_speed.md"]
    assert sorted(p.relative_to(docs).as_posix() for p in copied) == sorted(
        [*pages, *(f"figures/{p.removesuffix('.md')}.png" for p in pages)]
    )
    assert (docs / "ws_speed.md").read_text() == (reports / "bench" / "ws_speed.md").read_text()
    assert (docs / "figures" / "beyond_paper.png").read_bytes() == b"png of beyond_paper.md"
    assert not (docs / "figures" / "not_shown.png").exists()


def test_one_run_alone_and_its_optional_page(tmp_path):
    """`RUNS=reproduce`: a run without its one-word stages has no beyond_paper.md, and that is no missing run."""
    write_run(tmp_path / "reports", "offline", ["reproduction.md"])
    argv = ["--reports", str(tmp_path / "reports"), "--docs", str(tmp_path / "docs"), "--runs", "reproduce"]
    copied = results_pages.main(argv)
    assert [p.name for p in copied] == ["reproduction.png", "reproduction.md"]


def test_the_classifier_page_is_copied_when_asked_for_and_named_when_missing(tmp_path, capsys):
    reports, docs = tmp_path / "reports", tmp_path / "docs"
    write_run(reports, "offline", ["reproduction.md"])
    write_run(reports, "bench", ["ws_speed.md", "attack_speed.md"])
    results_pages.main(["--reports", str(reports), "--docs", str(docs)])  # the default runs need no classifier page
    assert not (docs / "real_classifier.md").exists()
    with pytest.raises(SystemExit):
        results_pages.main(["--runs", "bench", "classifier", "--reports", str(reports), "--docs", str(docs)])
    err = capsys.readouterr().err
    assert "no `make classifier` run to copy" in err and 'RUNS="bench"' in err
    write_run(reports, "classifier", ["real_classifier.md"])
    results_pages.main(["--runs", "classifier", "--reports", str(reports), "--docs", str(docs)])
    assert (docs / "real_classifier.md").read_text() == (reports / "classifier" / "real_classifier.md").read_text()


def reproduction_page(stages, records):
    """A reproduction page whose stage table lists `stages` (records each) and has a section per stage."""
    rows = [f"| {s} | title | {records} | 1 s |" for s in stages]
    sections = [f"## Stage {s}\n\ntext\n" for s in stages]
    total = f"| **all** | | {records * len(stages)} | **1 s** |"
    return "\n".join(["# Reproduction", "", "## Wall time per stage", "", *rows, total, "", *sections])


def test_a_page_that_covers_fewer_stages_than_the_docs_one_is_refused_unless_asked(tmp_path, capsys):
    reports, docs = tmp_path / "reports", tmp_path / "docs"
    (reports / "offline").mkdir(parents=True)
    docs.mkdir()
    committed = reproduction_page([f"s{i}" for i in range(13)], 150)
    (docs / "reproduction.md").write_text(committed)
    (reports / "offline" / "reproduction.md").write_text(reproduction_page(["s9"], 334))  # `--only s9`
    argv = ["--reports", str(reports), "--docs", str(docs), "--runs", "reproduce"]
    with pytest.raises(SystemExit) as exc:
        results_pages.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1
    assert "covers 2 sections, 334 records where" in err and "covers 14 sections, 1,950 records" in err
    assert "lacks 'Stage s0', 'Stage s1', 'Stage s2' and 9 more" in err and "REPLACE=1" in err
    assert (docs / "reproduction.md").read_text() == committed  # nothing replaced
    results_pages.main([*argv, "--replace"])
    assert (docs / "reproduction.md").read_text() == reproduction_page(["s9"], 334)


def test_a_page_with_every_section_but_fewer_records_is_refused_and_a_wider_one_replaces(tmp_path, capsys):
    reports, docs = tmp_path / "reports", tmp_path / "docs"
    (reports / "offline").mkdir(parents=True)
    docs.mkdir()
    (docs / "reproduction.md").write_text(reproduction_page(["a", "b"], 10))
    (reports / "offline" / "reproduction.md").write_text(reproduction_page(["a", "b"], 9))
    argv = ["--reports", str(reports), "--docs", str(docs), "--runs", "reproduce"]
    with pytest.raises(SystemExit):
        results_pages.main(argv)
    assert "it has fewer records" in capsys.readouterr().err
    wider = reproduction_page(["a", "b", "c"], 10)  # a new stage: more sections, more records
    (reports / "offline" / "reproduction.md").write_text(wider)
    results_pages.main(argv)
    assert (docs / "reproduction.md").read_text() == wider
