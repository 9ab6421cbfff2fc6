"""A prepared task's sidecars and records are tied to the manifest's shards: another shard's
lengths, or damaged record bytes, are one line naming the file."""

from __future__ import annotations

import os
import shutil

import pytest

from pipelines.prepared import manifest as manifest_lib
from pipelines.prepared import prepare as prepare_lib
from pipelines.prepared.shards import PreparedDataError, PreparedDataset


@pytest.fixture(scope="module")
def lm_en(tiny_data, seqio_state, tmp_path_factory):
    """`lm_en` prepared in 3 shards; its directory."""
    saved = seqio_state.snapshot()
    reg = prepare_lib.Registration(vocab_path=tiny_data["vocab"], corpora_dir=tiny_data["corpora"])
    reg.register()
    out = tmp_path_factory.mktemp("prepared")
    try:
        prepare_lib.prepare(
            task_name="lm_en", split="train", out_dir=out, num_shards=3, workers=1, log=print
        )
    finally:
        seqio_state.restore(saved)
    return os.path.join(out, "lm_en")


def _copy(directory: str, tmp_path) -> tuple[str, manifest_lib.Manifest]:
    copy = os.path.join(tmp_path, "lm_en")
    shutil.copytree(directory, copy)
    text = open(os.path.join(copy, manifest_lib.MANIFEST_FILE)).read()
    return copy, manifest_lib.Manifest.from_json(text)


def test_another_shards_lengths_are_refused_naming_the_sidecar(lm_en, tmp_path):
    directory, manifest = _copy(lm_en, tmp_path)
    # Shard 1's sidecar overwritten by shard 0's: right file name, other shard's lengths.
    first, second = (manifest_lib.sidecar_file(i, 3) for i in (0, 1))
    shutil.copy(os.path.join(directory, first), os.path.join(directory, second))
    with PreparedDataset.open(directory) as ds, pytest.raises(PreparedDataError) as err:
        ds.lengths("targets")
    message = str(err.value)
    assert message.startswith(os.path.join(directory, second)) and "\n" not in message
    assert "sha256" in message and manifest.shards[1].file in message


def test_damaged_record_bytes_name_the_shard(lm_en, tmp_path):
    directory, manifest = _copy(lm_en, tmp_path)
    entry = manifest.shards[0]
    path = os.path.join(directory, entry.file)
    with open(path, "r+b") as f:  # same size, damaged records
        f.seek(64)
        f.write(bytes(256))
    with pytest.raises(PreparedDataError) as err:
        with PreparedDataset.open(directory) as ds:
            ds.read(range(entry.documents))
    assert str(err.value).startswith(f"{path}: unreadable records: "), err.value


_OPEN_MANY = """
import resource, sys
from pipelines.prepared.shards import PreparedDataError, PreparedDataset
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[2]), int(sys.argv[3])))
opened = []
try:
    for _ in range(int(sys.argv[4])):
        opened.append(PreparedDataset.open(sys.argv[1]))
except PreparedDataError as e:
    print("refused:", e)
    sys.exit(3)
print("opened", len(opened), resource.getrlimit(resource.RLIMIT_NOFILE)[0])
"""


@pytest.mark.slow
def test_the_open_files_limit_is_raised_for_the_shards_or_refused_in_one_line(lm_en):
    """Every shard stays open for the run: a low soft limit is raised towards the hard one (no
    "Too many open files" mid-open), and a hard limit too low is one line saying so."""
    import subprocess
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def run(soft, hard, opens):
        return subprocess.run(
            [sys.executable, "-c", _OPEN_MANY, lm_en, str(soft), str(hard), str(opens)],
            capture_output=True,
            text=True,
            cwd=repo,
            timeout=120,
        )

    done = run(64, 4096, 40)  # 40 × 3 shards: past a soft limit of 64
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("opened 40") and int(done.stdout.split()[-1]) > 64
    refused = run(64, 64, 40)
    assert refused.returncode == 3, refused.stderr[-2000:]
    assert "shards stay open for the run" in refused.stdout and "ulimit" in refused.stdout
