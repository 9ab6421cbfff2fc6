"""SuperGLUE read where users keep it, and its seqio tasks (`super_glue_<task>`, mixture `super_glue`).

Two layouts, one record schema (`pipelines.superglue_text`):

- TFDS (`source="tfds"`): the prepared `super_glue/<config>/1.0.2/` directories under a TFDS data
  dir (`DATA_DIR`, else `$TFDS_DATA_DIR`, else `~/tensorflow_datasets`): tfrecord shards plus
  `dataset_info.json` and `features.json`, read with `tfds.builder(...).as_dataset` (no download).
- Hugging Face (`source="local"`, `"hf"`, `"hf_cpt"`): the `super_glue` dataset's files under
  `DATA_DIR/aps/super_glue/` or `DATA_DIR/super_glue/` (`huggingface-cli download aps/super_glue
  --repo-type dataset --local-dir DATA_DIR/aps/super_glue`): per config and split the Hub's
  parquet export `<config>/<split>-*.parquet`, what `datasets` writes (`<config>/<split>/*.parquet`,
  `<config>/<split>/*.arrow`), or JSON lines `<config>/<split>.jsonl` / `<config>/<split>-*.jsonl`.

Records are turned into text pairs in Python, in file order, and handed to seqio as a
`FunctionDataSource`; the tasks then tokenise (`pipelines.preprocessors.tokenize`), cache and
append EOS like the translation tasks, so `trainer.downstream` decodes them the same way and scores
them with `pipelines.superglue_metrics` (through `pipelines.text_metrics.task_scorer`). The
mixture `super_glue` mixes the tasks in proportion to their training examples (T5's
`super_glue_v102_proportional`).
"""

from __future__ import annotations

import fnmatch
import functools
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import seqio

from pipelines import preprocessors as prep
from pipelines import superglue_text
from pipelines.corpora import hf_sources, paths
from rundir import storage

TFDS_VERSION = "1.0.2"  # T5's `super_glue/<config>:1.0.2`
HF_DIRS = ("aps/super_glue", "super_glue")  # the Hub id, now and before
SPLITS = ("train", "validation", "test")
MIXTURE = superglue_text.MIXTURE
_HF_PATTERNS = (
    *(p for (p,) in hf_sources.DATASETS_LAYOUTS),
    "{config}/{split}.jsonl",
    "{config}/{split}-*.jsonl",
)
# Every column a SuperGLUE config has (parquet decodes only the columns asked for).
COLUMNS = (
    *("passage", "question", "premise", "hypothesis", "choice1", "choice2", "paragraph", "answer"),
    *("query", "entities", "answers", "sentence1", "sentence2", "word", "text"),
    *("span1_index", "span2_index", "span1_text", "span2_text", "label", "idx"),
)

# Training examples (text pairs) per task in the full SuperGLUE training sets (Wang et al. 2019,
# Table 1; MultiRC counts answer options, ReCoRD one pair per answer as T5 trains it): the
# mixture's rates, fixed so that registering never reads the data.
TRAIN_EXAMPLES: dict[str, int] = {
    "super_glue_boolq": 9427,
    "super_glue_cb": 250,
    "super_glue_copa": 400,
    "super_glue_multirc": 27243,
    "super_glue_record": 138854,
    "super_glue_rte": 2490,
    "super_glue_wic": 5428,
    "super_glue_wsc": 554,
}


def _plain(value: Any) -> Any:
    """TFDS numpy values as the HF files' Python values (str, int, list, dict)."""
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def tfds_dir(data_dir: str | os.PathLike | None) -> str:
    """The TFDS data dir: `data_dir`, else `$TFDS_DATA_DIR`, else `~/tensorflow_datasets`."""
    if data_dir:
        return os.fspath(data_dir)
    return os.environ.get("TFDS_DATA_DIR") or os.path.expanduser("~/tensorflow_datasets")


def tfds_configs(data_dir: str) -> list[str]:
    """The configs with a prepared `super_glue/<config>/1.0.2/dataset_info.json` under `data_dir`."""
    top = storage.as_path(data_dir) / "super_glue"
    return [
        c for c in superglue_text.CONFIGS if (top / c / TFDS_VERSION / "dataset_info.json").exists()
    ]


def tfds_records(data_dir: str, config: str, split: str) -> Iterator[dict]:
    """The records of a prepared TFDS split, in file order, as plain Python values."""
    import tensorflow_datasets as tfds

    builder = tfds.builder(f"super_glue/{config}:{TFDS_VERSION}", data_dir=data_dir)
    ds = builder.as_dataset(split=split, shuffle_files=False)
    for record in tfds.as_numpy(ds):
        yield _plain(record)


def hf_root(corpora_dir: str) -> str | None:
    """The directory holding the HF `super_glue` files under `corpora_dir` (None: none there)."""
    for rel in HF_DIRS:
        candidate = corpora_dir.rstrip("/") + "/" + rel
        if storage.as_path(candidate).is_dir():
            return candidate
    return None


def hf_files(root: str) -> dict[tuple[str, str], list[str]]:
    """`{(config, split): files}` for every config and split with files under `root` (the first
    layout of `_HF_PATTERNS` that has files, sorted)."""
    top = os.fspath(storage.as_path(root))
    rel = [os.fspath(p)[len(top) :].lstrip("/") for p in storage.list_files(top)]
    out = {}
    for config in superglue_text.CONFIGS:
        for split in SPLITS:
            for pattern in _HF_PATTERNS:
                pat = pattern.format(config=config, split=split)
                found = [f for f in rel if fnmatch.fnmatch(f, pat)]
                if found:
                    out[config, split] = [top + "/" + f for f in found]
                    break
    return out


def hf_records(files: list[str]) -> Iterator[dict]:
    """The records of a split's HF files, file by file."""
    for path in files:
        yield from hf_sources.read_records(path, COLUMNS)


def _text_dataset(records, config: str, split: str, shuffle_files: bool = False, seed=None):
    """tf.data of `{"inputs", "targets"}` strings from the split's records (file order)."""
    import tensorflow as tf

    del shuffle_files, seed  # the task's shuffle buffer shuffles; files stay in order

    def pairs():
        for record in records(split):
            for inputs, targets in superglue_text.to_text(config, record):
                yield {"inputs": inputs, "targets": targets}

    spec = tf.TensorSpec((), tf.string)
    return tf.data.Dataset.from_generator(pairs, output_signature={"inputs": spec, "targets": spec})


def sources(
    corpora_dir: str | os.PathLike | None, *, source: str
) -> dict[str, seqio.FunctionDataSource]:
    """`{task name: seqio source}` for every SuperGLUE config found (empty when none is).

    Args:
      corpora_dir: `DATA_DIR`: the TFDS data dir (`source="tfds"`) or the root holding the HF
        files (other sources; None: `$XLSCALE_DATA/corpora`).
      source: `"tfds"`, or a file source of `pipelines.tasks.SOURCES`.
    """
    found: dict[str, tuple[Any, list[str]]] = {}  # config -> (records(split), splits)
    if source == "tfds":
        data_dir = tfds_dir(corpora_dir)
        for config in tfds_configs(data_dir):
            read = functools.partial(tfds_records, data_dir, config)
            found[config] = (read, list(SPLITS))
    else:
        root = hf_root(os.fspath(corpora_dir) if corpora_dir else os.fspath(paths.corpora_dir()))
        by_split = hf_files(root) if root else {}
        for config in superglue_text.CONFIGS:
            splits = [s for s in SPLITS if (config, s) in by_split]
            if "train" in splits:
                files = {s: by_split[config, s] for s in splits}
                found[config] = (lambda split, f=files: hf_records(f[split]), splits)
    return {
        task: seqio.FunctionDataSource(
            dataset_fn=functools.partial(_text_dataset, found[config][0], config),
            splits=found[config][1],
        )
        for task, config in superglue_text.TASK_CONFIGS.items()
        if config in found
    }


def register(
    *, vocabulary, corpora_dir: str | os.PathLike | None, source: str, shuffle_buffer_size: int
) -> list[str]:
    """Registers (idempotently) a `super_glue_<task>` seqio task per SuperGLUE task found and,
    when any is, the mixture `super_glue` of those found. Returns the task names; [] when no
    SuperGLUE data is there."""
    features = {
        "inputs": seqio.Feature(vocabulary, add_eos=True),
        "targets": seqio.Feature(vocabulary, add_eos=True),
    }
    names = []
    for task, source_ in sources(corpora_dir, source=source).items():
        if task in seqio.TaskRegistry.names():
            seqio.TaskRegistry.remove(task)
        seqio.TaskRegistry.add(
            task,
            source=source_,
            output_features=features,
            preprocessors=[
                prep.tokenize,
                seqio.CacheDatasetPlaceholder(),
                seqio.preprocessors.append_eos_after_trim,
            ],
            shuffle_buffer_size=shuffle_buffer_size,
        )
        names.append(task)
    if names:
        if MIXTURE in seqio.MixtureRegistry.names():
            seqio.MixtureRegistry.remove(MIXTURE)
        seqio.MixtureRegistry.add(MIXTURE, [(t, float(TRAIN_EXAMPLES[t])) for t in names])
    return names
