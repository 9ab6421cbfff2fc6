"""Assembly of the Debian corpora from extracted package data (no apt, no network): filtering,
deduplication, test-overlap removal, splits, manifest; plus the private APT configuration."""

from __future__ import annotations

import json

import pytest

from pipelines.corpora import apt, build, layout, paths, sources

GUIDE_DE = [
    (
        "Debian does not impose hardware requirements beyond the kernel.",
        "Debian stellt keine Hardware-Anforderungen über die des Kernels hinaus.",
    ),
    (
        "Installing Debian GNU/Linux from a USB stick",
        "Installation von Debian GNU/Linux von einem USB-Stick",
    ),
    ("amd64", "amd64"),  # identical: filtered out of the test set
]


def _extracted() -> dict[str, dict]:
    gettext_de = [
        (f"Copy file number {i} to the folder", f"Datei Nummer {i} in den Ordner kopieren")
        for i in range(400)
    ]
    gettext_de += [
        ("Copy file number 1 to the folder", "Datei Nummer 1 in den Ordner kopieren"),  # duplicate
        ("Untranslated message here", "Untranslated message here"),
        # Equal to a test pair: must not be trained on.
        (
            "Installing Debian GNU/Linux from a USB stick",
            "Installation von Debian GNU/Linux von einem USB-Stick",
        ),
    ]
    return {
        "coreutils": {
            "kind": "gettext",
            "version": "9.1-1",
            "deb": "coreutils_9.1-1_amd64.deb",
            "deb_sha256": "0" * 64,
            "pairs": {"de": [list(p) for p in gettext_de]},
            "licence": {"licence": "GPL-3+", "licences": ["GPL-3+"]},
        },
        "installation-guide-amd64": {
            "kind": "guide",
            "version": "20230508",
            "pairs": {"de": [list(p) for p in GUIDE_DE]},
            "stats": {"de": {"files": 1, "files_matched": 1, "blocks_paired": 3}},
            "licence": {"licence": "GPL-2"},
        },
        "manpages": {
            "kind": "man",
            "version": "6.03-2",
            "paragraphs": {
                "en": [
                    "The ls command lists the contents of a directory in the order requested.",
                    "Debian does not impose hardware requirements beyond the kernel.",  # test overlap
                    "-a, --all",  # too short for running text
                ]
            },
            "licence": {"licence": "GPL-2+"},
        },
        "manpages-de": {
            "kind": "man",
            "version": "4.18.1-1",
            "paragraphs": {
                "de": [
                    "Der Befehl ls listet den Inhalt eines Verzeichnisses in der gewünschten Reihenfolge auf.",
                    "This paragraph was left in English by the translators of the page.",
                ]
            },
            "licence": {"licence": "GPL-3+"},
        },
    }


DESCRIPTIONS = {
    "en": {
        "aaa": [
            "example package based on GNU hello",
            "The GNU hello program produces a familiar, friendly greeting.",
        ]
    },
    "de": {
        "aaa": [
            "Beispielpaket, das auf GNU hello basiert",
            "Das Programm GNU hello gibt einen freundlichen Gruß aus.",
        ]
    },
}


def test_write_corpora(tmp_path):
    corpora = tmp_path / "corpora"
    manifest = build.write_corpora(
        corpora,
        langs=["de", "en"],
        extracted=_extracted(),
        descriptions_by_lang=DESCRIPTIONS,
        log=lambda _: None,
    )
    test = layout.read_pairs(paths.test_file(corpora, "en-de"))
    assert test == GUIDE_DE[:2]
    train = layout.read_pairs(paths.parallel_file(corpora, "en-de", "train"))
    valid = layout.read_pairs(paths.parallel_file(corpora, "en-de", "validation"))
    assert len(train) + len(valid) == 400 + 2  # 400 unique catalogue pairs + 2 description pairs
    assert valid and not {en for en, _ in train} & {en for en, _ in valid}
    assert not set(train + valid) & set(test)
    assert (
        "The GNU hello program produces a familiar, friendly greeting.",
        "Das Programm GNU hello gibt einen freundlichen Gruß aus.",
    ) in train + valid

    en_mono = layout.read_lines(paths.mono_file(corpora, "en", "train")) + layout.read_lines(
        paths.mono_file(corpora, "en", "validation")
    )
    assert "The ls command lists the contents of a directory in the order requested." in en_mono
    assert "Debian does not impose hardware requirements beyond the kernel." not in en_mono
    assert "-a, --all" not in en_mono
    de_mono = layout.read_lines(paths.mono_file(corpora, "de", "train")) + layout.read_lines(
        paths.mono_file(corpora, "de", "validation")
    )
    assert de_mono[0].startswith("Der Befehl ls")
    assert not any("left in English" in x for x in de_mono)
    assert "Datei Nummer 7 in den Ordner kopieren" in de_mono  # catalogue target sides

    on_disk = json.loads(paths.manifest_file(corpora).read_text(encoding="utf-8"))
    assert on_disk == manifest
    assert manifest["pairs"]["en-de"]["test"]["pairs"] == 2
    assert (
        manifest["pairs"]["en-de"]["train"]["sha256"]
        == layout.file_stats(paths.parallel_file(corpora, "en-de", "train"))["sha256"]
    )
    par = manifest["breakdown"]["parallel"]["en-de"]
    assert par["by_source"] == {"coreutils": 400, "descriptions": 2}
    assert par["removed_test_overlap"] == 1
    assert manifest["breakdown"]["mono"]["en"]["removed_test_overlap"] == 1
    srcs = {s["package"]: s for s in manifest["sources"]}
    assert srcs["coreutils"]["version"] == "9.1-1" and srcs["coreutils"]["licence"] == "GPL-3+"
    assert any("Held-out test set" in n for n in manifest["notes"])
    assert manifest["languages"]["de"]["train"]["lines"] == len(
        layout.read_lines(paths.mono_file(corpora, "de", "train"))
    )


def test_write_corpora_is_deterministic_and_notes_romanian(tmp_path):
    extracted = _extracted()
    extracted["manpages-ro"] = {
        "kind": "man",
        "version": "4.18.1-1",
        "paragraphs": {"ro": ["Comanda ls afișează conținutul unui director în ordinea cerută."]},
    }
    outs = []
    for name in ("a", "b"):
        build.write_corpora(
            tmp_path / name,
            langs=paths.LANGS,
            extracted=extracted,
            descriptions_by_lang=DESCRIPTIONS,
            log=lambda _: None,
        )
        outs.append(
            {
                p.relative_to(tmp_path / name): p.read_bytes()
                for p in sorted((tmp_path / name).rglob("*"))
                if p.is_file()
            }
        )
    assert outs[0] == outs[1]
    manifest = json.loads(outs[0][paths.manifest_file(".").relative_to(".")])
    assert any(n.startswith("Romanian is the thin language") for n in manifest["notes"])


def test_private_apt_config(tmp_path):
    state = apt.AptState.create(tmp_path / "apt")
    conf = state.config.read_text()
    assert f'Dir::Etc::Parts "{tmp_path / "apt" / "etc-parts"}";' in conf
    assert not any((tmp_path / "apt" / "etc-parts").iterdir())
    assert f'Dir::State::Lists "{tmp_path / "apt" / "lists"}";' in conf
    assert 'Acquire::Languages {"en";"de";"fr";"ru";"zh_CN";};' in conf
    assert state.env()["APT_CONFIG"] == str(state.config)
    assert not state.has_lists()


def test_apt_policy_parsing_and_deb_names(tmp_path, monkeypatch):
    policy = (
        "git:\n  Installed: (none)\n  Candidate: 1:2.39.5-0+deb12u3\n  Version table:\n"
        "nosuch:\n  Installed: (none)\n  Candidate: (none)\n"
    )
    state = apt.AptState(tmp_path)
    monkeypatch.setattr(apt.AptState, "run", lambda self, args, **kw: policy)
    assert state.candidates(["git", "nosuch"]) == {"git": "1:2.39.5-0+deb12u3"}
    (tmp_path / "git_1%3a2.39.5-0+deb12u3_amd64.deb").write_bytes(b"")
    assert apt.AptState.deb_path("git", "1:2.39.5-0+deb12u3", tmp_path) is not None
    assert apt.AptState.deb_path("git", "1:2.40", tmp_path) is None


def test_build_reports_missing_tools_and_bad_langs(tmp_path, monkeypatch):
    with pytest.raises(build.BuildError, match="unknown languages"):
        build.build_corpora(data_dir=tmp_path, langs=["xx"])
    monkeypatch.setitem(apt.TOOLS, "no-such-tool-xlscale", "no-such-package")
    with pytest.raises(build.BuildError, match="no-such-tool-xlscale.*no-such-package"):
        build.build_corpora(data_dir=tmp_path, langs=["en"])
    assert not (tmp_path / "debian").exists()  # failed before touching anything


def test_licence_of(tmp_path):
    doc = tmp_path / "usr/share/doc/pkg"
    doc.mkdir(parents=True)
    (doc / "copyright").write_text(
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\n"
        "Files: *\nCopyright: 2020 Someone\nLicense: GPL-3+\n\n"
        "Files: po/*\nCopyright: 2021 Other\nLicense: LGPL-2.1+\n"
    )
    info = sources.licence_of(tmp_path, "pkg")
    assert info["licence"] == "GPL-3+" and info["licences"] == ["GPL-3+", "LGPL-2.1+"]
    (doc / "copyright").write_text(
        "It is licensed under the GNU GPL.\nSee /usr/share/common-licenses/GPL-2 on Debian.\n"
    )
    assert sources.licence_of(tmp_path, "pkg")["licence"] == "GPL-2"


def test_package_table():
    assert {p.kind for p in sources.PACKAGES.values()} == {"man", "gettext", "guide"}
    assert set(sources.packages_for(("ro",))) >= {
        "manpages-ro",
        "libreoffice-l10n-ro",
        "installation-guide-amd64",
    }
    assert "manpages-de" not in sources.packages_for(("ro",))
