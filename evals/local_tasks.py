"""Local multiple-choice tasks from the project's own held-out corpora, as lm-eval YAML tasks.

The machines reach no dataset hub, so the zero-shot path is exercised on tasks built from the
corpora (`pipelines.corpora`, Debian build or the UDHR fixture), one of each kind per language:

- `xl_cont_<lang>` (XStoryCloze/HellaSwag-style): a held-out passage cut in two; the context is
  its first half, the gold choice its true second half, the three distractors second halves of
  passages from other lines, of the nearest lengths.
- `xl_trans_<lang>` (only where an `en-<lang>` pair exists): an English sentence with a short
  prompt; the gold choice its `lang` translation, the distractors translations of other sentences.

Held-out text is the validation split and the held-out translation test set, never training
text. Each task is one JSONL data file and one YAML (`dataset_path: json`, which `datasets` loads
offline from the local file), plus an index `tasks.json` that the results read chance level and
language from. Same inputs, same bytes; every file is written atomically.

    tasks = write_local_tasks(corpora, out_dir, langs=["en", "zh"], items=200)
    lm_eval --model xlscale --include_path {tasks.dir} --tasks xl_cont_zh,xl_trans_zh ...
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipelines.names import LANG_NAMES
from rundir import storage

log = logging.getLogger(__name__)

INDEX_FILE = "tasks.json"
CHOICES = 4  # gold + 3 distractors
MIN_ITEMS = 4  # a task with fewer items is not written
# A translation pair is used only if both sides are at most this many characters, so the prompt
# and a choice fit the short context windows of the small models.
MAX_TRANSLATION_CHARS = 256
# Distractors are drawn at random from this many candidates of the nearest lengths.
NEAREST_POOL = 8
# Each kind of task, and the prefix of its task names (`<prefix><lang>`).
TASK_PREFIX_BY_KIND: dict[str, str] = {"continuation": "xl_cont_", "translation": "xl_trans_"}
TASK_PREFIXES = tuple(TASK_PREFIX_BY_KIND.values())


@dataclasses.dataclass(frozen=True)
class SplitRule:
    """How a language's text is cut into units (words or characters) and passages.

    Attributes:
      unit: `word` or `character` (for the docs and the index).
      joiner: what joins units back into text (a space between words, nothing between characters).
      window: target passage length in units; a long line gives several passages of
        `window`..`2*window-1` units.
      min_units: the shortest passage kept (its context and ending are each about half of it).
    """

    unit: str
    joiner: str
    window: int
    min_units: int

    def units(self, text: str) -> list[str]:
        """The units of `text`: whitespace-separated words, or characters."""
        return text.split() if self.joiner else list(text)


WORDS = SplitRule(unit="word", joiner=" ", window=12, min_units=8)
CHARACTERS = SplitRule(unit="character", joiner="", window=24, min_units=16)
# Languages written without spaces between words are cut by characters; others by words.
SPLIT_RULES: dict[str, SplitRule] = {"zh": CHARACTERS, "ja": CHARACTERS}


def split_rule(lang: str) -> SplitRule:
    """The split rule of `lang` (`SPLIT_RULES`, default words)."""
    return SPLIT_RULES.get(lang, WORDS)


@dataclasses.dataclass(frozen=True)
class LocalTasks:
    """The local tasks written by `write_local_tasks`.

    Attributes:
      dir: the directory to pass to lm-eval as `include_path`.
      tasks: task name -> language, for the tasks written.
      skipped: task name -> why it was not written (too few usable items).
    """

    dir: Path
    tasks: dict[str, str]
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class _Candidate:
    """A context with its true answer, before distractors are drawn; `group` marks the
    line it came from, so distractors come from other lines."""

    context: str
    answer: str
    group: int


def _dedupe(lines: Sequence[str]) -> list[str]:
    return list(dict.fromkeys(line.strip() for line in lines if line.strip()))


def _held_out_lines(corpora: Path, lang: str) -> tuple[list[str], list[Path]]:
    """The held-out text of `lang`: its validation split and its side of the held-out
    translation test sets; returns the lines and the files read.

    Raises:
      ValueError: no validation file (or an empty one) for `lang`.
    """
    from pipelines.corpora import layout, paths

    validation = paths.mono_file(corpora, lang, "validation")
    lines = layout.read_lines(validation) if validation.is_file() else []
    if not any(line.strip() for line in lines):
        raise ValueError(
            f"corpora {corpora}: no held-out text for language {lang!r}: expected its validation "
            f"split at {validation} ({'empty' if validation.is_file() else 'missing'}); build "
            "the corpora for it with `xlscale data build --langs ...` or `xlscale data fixture`"
        )
    files = [validation]
    pairs = paths.PAIRS if lang == "en" else [f"en-{lang}"]
    for pair in pairs:
        test = paths.test_file(corpora, pair)
        if test.is_file():
            side = 0 if lang == "en" else 1
            lines += [row[side] for row in layout.read_pairs(test) if len(row) == 2]
            files.append(test)
    return _dedupe(lines), files


def _passages(line: str, rule: SplitRule) -> list[tuple[str, str]]:
    """`line` cut into passages of about `rule.window` units, each split in half into
    (context, ending); passages shorter than `rule.min_units` are dropped."""
    units = rule.units(line)
    pieces = max(1, len(units) // rule.window)
    bounds = [round(i * len(units) / pieces) for i in range(pieces + 1)]
    out = []
    for start, stop in zip(bounds, bounds[1:], strict=False):
        piece = units[start:stop]
        if len(piece) < rule.min_units:
            continue
        half = len(piece) // 2
        context = rule.joiner.join(piece[:half]).strip()
        ending = rule.joiner.join(piece[half:]).strip()
        if context and ending:
            out.append((context, ending))
    return out


def _continuation_candidates(lines: Sequence[str], lang: str) -> list[_Candidate]:
    rule = split_rule(lang)
    return [
        _Candidate(context, ending, group)
        for group, line in enumerate(lines)
        for context, ending in _passages(line, rule)
    ]


def _translation_pairs(corpora: Path, lang: str) -> tuple[list[tuple[str, str]], list[Path]]:
    """The held-out `(english, lang)` pairs of `en-<lang>` (validation split and test set) with
    both sides at most `MAX_TRANSLATION_CHARS`; `([], [])` where no such pair file exists."""
    from pipelines.corpora import layout, paths

    if lang == "en":
        return [], []
    pair = f"en-{lang}"
    files = [
        f
        for f in (paths.parallel_file(corpora, pair, "validation"), paths.test_file(corpora, pair))
        if f.is_file()
    ]
    rows: list[tuple[str, str]] = []
    # Each English sentence and each translation once, so no distractor is also right.
    seen: set[tuple[str, str]] = set()
    for f in files:
        for row in layout.read_pairs(f):
            en, xx = (row[0].strip(), row[1].strip()) if len(row) == 2 else ("", "")
            if en and xx and max(len(en), len(xx)) <= MAX_TRANSLATION_CHARS:
                if ("en", en) not in seen and ("xx", xx) not in seen:
                    rows.append((en, xx))
                    seen |= {("en", en), ("xx", xx)}
    return rows, files


def _translation_candidates(pairs: Sequence[tuple[str, str]], lang: str) -> list[_Candidate]:
    name = LANG_NAMES.get(lang, lang)
    return [
        _Candidate(f"English: {en}\n{name}:", xx, group) for group, (en, xx) in enumerate(pairs)
    ]


def _items(candidates: Sequence[_Candidate], *, items: int, rng: random.Random) -> list[dict]:
    """Up to `items` multiple-choice docs: candidates in a seeded order, each with 3 distractors
    (answers of candidates from other lines, distinct from the gold and from each other, drawn
    from the `NEAREST_POOL` nearest in length) and the gold at a seeded position."""
    order = list(range(len(candidates)))
    rng.shuffle(order)
    docs: list[dict] = []
    for index in order:
        if len(docs) >= items:
            break
        gold = candidates[index]
        others = {
            c.answer: None for c in candidates if c.group != gold.group and c.answer != gold.answer
        }
        if len(others) < CHOICES - 1:
            continue
        nearest = sorted(others, key=lambda a: (abs(len(a) - len(gold.answer)), a))
        distractors = rng.sample(nearest[: max(NEAREST_POOL, CHOICES - 1)], CHOICES - 1)
        position = rng.randrange(CHOICES)
        choices = [*distractors[:position], gold.answer, *distractors[position:]]
        docs.append({"context": gold.context, "choices": choices, "gold": position})
    return docs


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8", newline="\n")
    os.replace(tmp, path)


def _q(value: str) -> str:
    """A YAML double-quoted scalar (JSON's ASCII-escaped string, which YAML reads alike)."""
    return json.dumps(value)


def task_yaml(*, task: str, lang: str, kind: str, data_file: Path, delimiter: str) -> str:
    """The lm-eval 0.4 YAML of one local task over its JSONL `data_file` (absolute path)."""
    return "\n".join(
        [
            f"# Written by evals.local_tasks.write_local_tasks ({kind}, {lang}); do not edit.",
            f"task: {task}",
            "tag:",
            "  - xl_local",
            f"  - xl_local_{lang}",
            "dataset_path: json",
            "dataset_kwargs:",
            "  data_files:",
            f"    test: {_q(os.fspath(data_file))}",
            "output_type: multiple_choice",
            "test_split: test",
            "doc_to_text: context",
            "doc_to_choice: choices",
            "doc_to_target: gold",
            f"target_delimiter: {_q(delimiter)}",
            "metric_list:",
            "  - metric: acc",
            "    aggregation: mean",
            "    higher_is_better: true",
            "  - metric: acc_norm",
            "    aggregation: mean",
            "    higher_is_better: true",
            "metadata:",
            "  version: 1.0",
            f"  language: {_q(lang)}",
            f"  kind: {kind}",
            "",
        ]
    )


@dataclasses.dataclass(frozen=True)
class _TaskPlan:
    """One task to write: its candidates, where they came from, and how the choice follows the
    context (`delimiter`)."""

    lang: str
    kind: str
    candidates: list[_Candidate]
    sources: list[Path]
    delimiter: str

    @property
    def task(self) -> str:
        """The task's name: its kind's prefix and the language."""
        return TASK_PREFIX_BY_KIND[self.kind] + self.lang


def _plans(corpora: Path, lang: str) -> list[_TaskPlan]:
    lines, mono_sources = _held_out_lines(corpora, lang)
    plans = [
        _TaskPlan(
            lang=lang,
            kind="continuation",
            candidates=_continuation_candidates(lines, lang),
            sources=mono_sources,
            delimiter=split_rule(lang).joiner,
        )
    ]
    pairs, pair_sources = _translation_pairs(corpora, lang)
    if pair_sources:
        plans.append(
            _TaskPlan(
                lang=lang,
                kind="translation",
                candidates=_translation_candidates(pairs, lang),
                sources=pair_sources,
                delimiter=" ",
            )
        )
    return plans


def write_local_tasks(
    corpora: Path, out_dir: Path, *, langs: list[str], items: int, seed: int = 0
) -> LocalTasks:
    """Writes the continuation and translation tasks of `langs` under `out_dir`.

    Args:
      corpora: a corpora directory (`<data root>/corpora`, the layout of `pipelines.corpora`).
      out_dir: where the YAML, JSONL and `tasks.json` go (created); task files of earlier calls
        that this call does not write again are removed, so lm-eval finds only current tasks.
      langs: languages; each needs a validation split, the translation task an `en-<lang>` pair.
      items: at most this many items per task (fewer where the held-out text has fewer).
      seed: fixes the passages chosen, the distractors and the gold positions.

    Returns:
      The directory and the tasks written (and those skipped, with why).

    Raises:
      ValueError: `items` < 1, or a language with no held-out text (naming the file expected).
    """
    if items < 1:
        raise ValueError(f"items={items}: need at least 1 item per task")
    corpora = Path(corpora)
    why = "lm-evaluation-harness reads its task YAML and JSONL from local files"
    out_dir = storage.local_dir(out_dir, name="out_dir", why=why)
    plans = [plan for lang in dict.fromkeys(langs) for plan in _plans(corpora, lang)]
    out_dir.mkdir(parents=True, exist_ok=True)
    index: dict[str, dict[str, Any]] = {}
    skipped: dict[str, str] = {}
    for plan in plans:
        rng = random.Random(f"{seed}:{plan.task}")
        docs = _items(plan.candidates, items=items, rng=rng)
        if len(docs) < MIN_ITEMS:
            skipped[plan.task] = (
                f"{len(docs)} usable item(s) from {', '.join(map(str, plan.sources))} "
                f"(fewer than {MIN_ITEMS})"
            )
            log.warning("local task %s not written: %s", plan.task, skipped[plan.task])
            continue
        data_file = out_dir / f"{plan.task}.jsonl"
        lines = [
            json.dumps({"id": f"{plan.task}/{i}", **doc}, ensure_ascii=False, sort_keys=True)
            for i, doc in enumerate(docs)
        ]
        _atomic_write(data_file, "".join(line + "\n" for line in lines))
        yaml_text = task_yaml(
            task=plan.task,
            lang=plan.lang,
            kind=plan.kind,
            data_file=data_file,
            delimiter=plan.delimiter,
        )
        _atomic_write(out_dir / f"{plan.task}.yaml", yaml_text)
        index[plan.task] = {
            "language": plan.lang,
            "kind": plan.kind,
            "choices": CHOICES,
            "chance": 1.0 / CHOICES,
            "n": len(docs),
            "source": os.fspath(plan.sources[0]),
            "sources": [os.fspath(f) for f in plan.sources],
            "seed": seed,
        }
    for stale in sorted(out_dir.iterdir()):
        if (
            stale.name.startswith(TASK_PREFIXES)
            and stale.suffix in (".yaml", ".jsonl")
            and stale.stem not in index
        ):
            stale.unlink()
    text = json.dumps(index, ensure_ascii=False, indent=2, sort_keys=True) + "\n"
    _atomic_write(out_dir / INDEX_FILE, text)
    return LocalTasks(
        dir=out_dir, tasks={t: e["language"] for t, e in index.items()}, skipped=skipped
    )


def _read_index(directory: Path) -> dict[str, dict[str, Any]]:
    path = Path(directory) / INDEX_FILE
    if not path.is_file():
        raise ValueError(
            f"local tasks {directory}: no {INDEX_FILE} (write the tasks with `xlscale data build` "
            "or evals.local_tasks.write_local_tasks)"
        )
    return json.loads(path.read_text(encoding="utf-8"))


def read_local_tasks(directory: Path) -> dict[str, str]:
    """Task name -> language of the local tasks under `directory` (its `tasks.json`).

    Raises:
      ValueError: `directory` has no `tasks.json`.
    """
    return {task: entry["language"] for task, entry in _read_index(directory).items()}


def task_info(directory: Path, task: str) -> dict[str, Any]:
    """The index entry of one local task: `language`, `kind`, `choices`, `chance`, `n`, `source`.

    Raises:
      ValueError: no `tasks.json` under `directory`, or `task` not in it (naming those that are).
    """
    index = _read_index(directory)
    if task not in index:
        raise ValueError(
            f"local tasks {directory}: no task {task!r} in {INDEX_FILE}; tasks: {sorted(index)}"
        )
    return index[task]
