"""The committed UDHR fixture: layout of docs/interfaces.md, fixed disjoint splits, manifest."""

from __future__ import annotations

import json

from pipelines.corpora import fixture, layout, paths
from xlscale_cli import main as cli


def test_fixture_layout_and_splits(tmp_path):
    corpora = fixture.write_fixture_corpora(tmp_path)
    assert corpora == tmp_path / "corpora"
    for lang in paths.LANGS:
        train = layout.read_lines(paths.mono_file(corpora, lang, "train"))
        valid = layout.read_lines(paths.mono_file(corpora, lang, "validation"))
        assert train and valid and not set(train) & set(valid)
        # Enough text for a tiny SentencePiece model.
        assert sum(len(x.encode()) for x in train) > 5000
        assert all("\t" not in x and x == x.strip() for x in train + valid)
    for pair in paths.PAIRS:
        rows = {
            split: layout.read_pairs(paths.parallel_file(corpora, pair, split))
            for split in paths.PARALLEL_SPLITS
        }
        rows["test"] = layout.read_pairs(paths.test_file(corpora, pair))
        assert [len(rows[s]) for s in ("train", "validation", "test")] == [24, 4, 3]
        english = {s: {en for en, _ in r} for s, r in rows.items()}
        assert not english["train"] & english["test"]
        assert not english["train"] & english["validation"]
        assert all(len(r) == 2 and r[0] and r[1] for r in rows["train"])
    zh_test = layout.read_pairs(paths.test_file(corpora, "en-zh"))
    assert zh_test[0][0].startswith("Everyone has the right to an effective remedy")
    assert zh_test[0][1].startswith("任何人当宪法或法律所赋予他的基本权利")


def test_fixture_manifest_matches_files_and_is_deterministic(tmp_path):
    corpora = fixture.write_fixture_corpora(tmp_path / "a")
    manifest = json.loads(paths.manifest_file(corpora).read_text(encoding="utf-8"))
    assert manifest["kind"] == "udhr-fixture"
    assert manifest["sources"][0]["package"] == "udhr"
    assert manifest["sources"][0]["version"] == "6.0.0"
    assert "MIT" in manifest["sources"][0]["licence"]
    stats = manifest["languages"]["ro"]["train"]
    assert stats == layout.file_stats(paths.mono_file(corpora, "ro", "train"))
    assert manifest["pairs"]["en-de"]["test"]["pairs"] == 3
    again = fixture.write_fixture_corpora(tmp_path / "b")
    for f in sorted(corpora.rglob("*")):
        if f.is_file():
            assert f.read_bytes() == (again / f.relative_to(corpora)).read_bytes(), f


def test_cli_data_fixture(tmp_path, capsys):
    assert cli.main(["data", "fixture", "--out", str(tmp_path)]) == 0
    assert paths.manifest_file(tmp_path / "corpora").exists()
    assert cli.main(["data", "show", "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "en-zh" in out and "train lines" in out
