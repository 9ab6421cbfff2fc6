"""Every setting of the papers' gin files says where it comes from: the paper, with the entry of
`fitting.paper_quotes` that holds its words, or ours, with its source (T5X's default, Raffel et
al., LLaMA2's, our choice).

A setting is a binding of a literal value (`NAME = 0.1`, `  decay_rate = 0.8` in a block); a
binding whose value refers to another macro (`%X`, `[%X]`), a configurable (`@f()`) or
`%gin.REQUIRED` is plumbing and needs no label, nor do `BOOKKEEPING` names (what or where a run is, not how it trains). The label is the
line's trailing comment: `# paper ... [q:<key>] ...` (the key an entry of that paper) or
`# ours: <source>`.
"""

from __future__ import annotations

import pathlib
import re

import pytest

from fitting import paper_quotes

CONFIGS = pathlib.Path(__file__).resolve().parent.parent / "t5x_configs"
# The gin files of each paper's recipe (file -> the paper its "paper" labels cite).
PAPER_FILES = {
    "runs/common/cpt_paper.gin": "cpt",
    "runs/pretrain.gin": "cpt",
    "runs/cpt.gin": "cpt",
    "experiments/cpt.gin": "cpt",
    "experiments/cpt_replay.gin": "cpt",
    "experiments/cpt_scratch.gin": "cpt",
    "experiments/cpt_source_en.gin": "cpt",
    "runs/common/mt_paper.gin": "mt",
    "runs/span_pretrain.gin": "mt",
    "runs/finetune.gin": "mt",
    "runs/common/decode.gin": "mt",
    "experiments/mt_pretrain.gin": "mt",
    "experiments/mt_finetune.gin": "mt",
    "experiments/superglue.gin": "mt",
    "t5x/runs/span_pretrain.gin": "mt",
    "t5x/runs/finetune.gin": "mt",
    "t5x/models/t5.gin": "mt",
    "t5x/models/t5_3b.gin": "mt",
    "t5x/models/t5_770m.gin": "mt",
    "models/llama2.gin": "cpt",
    "models/t5.gin": "mt",
}
BOOKKEEPING = {
    "STRATEGY",
    "MODEL_DIR",
    "INIT_CHECKPOINT",
    "MIXTURE",
    "MIXTURE_OR_TASK_NAME",
    "MIXTURE_OR_TASK_MODULE",
    "TASK",
    "VOCAB_PATH",
    "EVAL_TASKS",
    "DECODE_TASKS",
    "COMET_MODEL",
    "COMET_PYTHON",
    "USE_CACHED_TASKS",
    "MODEL_SIZE",
}
BINDING = re.compile(
    r"^\s*(?P<name>[A-Za-z_][\w./]*)\s*=\s*(?P<value>[^#]+?)\s*(?:#\s*(?P<label>.*))?$"
)
PAPER_LABEL = re.compile(r"^paper\b")
OURS_LABEL = re.compile(r"^ours: \S")


def unlabelled(text: str, paper: str) -> list[str]:
    """`line: binding (why)` for every setting of a gin file's `text` without a valid label."""
    bad = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith(("#", "include", "from ", "import ")):
            continue
        m = BINDING.match(line)
        if not m:
            continue
        name, value, label = m["name"], m["value"], (m["label"] or "").strip()
        if "%" in value or "@" in value or name.split(".")[-1] in BOOKKEEPING:
            continue
        keys = paper_quotes.cited(label)
        if PAPER_LABEL.match(label):
            papers = {paper_quotes.QUOTES[k].paper for k in keys if k in paper_quotes.QUOTES}
            if paper not in papers:
                bad.append(f"{number}: {name} = {value} (a 'paper' label cites no {paper} entry)")
        elif not OURS_LABEL.match(label):
            bad.append(f"{number}: {name} = {value} (no '# paper ... [q:key]' or '# ours: ...')")
    return bad


@pytest.mark.parametrize("path", sorted(PAPER_FILES))
def test_every_setting_of_the_papers_gin_files_is_labelled(path):
    assert unlabelled((CONFIGS / path).read_text(), PAPER_FILES[path]) == []


def test_the_label_check_finds_a_missing_or_wrong_label():
    text = "\n".join(
        [
            "BATCH_SIZE = 128  # paper [q:mt.s4_finetune]",
            "PEAK_LR = 1e-3  # ours: T5X's default",
            "DROPOUT_RATE = 0.1",
            "TRAIN_STEPS = %FINETUNE_STEPS",
            "EVAL_TASKS = [%TASK]",
            "STRATEGY = 'finetune'",
            "optimizers.OptimizerConfig:",
            "  decay_rate = 0.8  # T5X's",
            "  name = 'adafactor'  # paper [q:cpt.s2_1_tokens_20x]",
            "  clipping_threshold = 1.0  # paper [q:mt.no_such_entry]",
        ]
    )
    assert unlabelled(text, "mt") == [
        "3: DROPOUT_RATE = 0.1 (no '# paper ... [q:key]' or '# ours: ...')",
        "8: decay_rate = 0.8 (no '# paper ... [q:key]' or '# ours: ...')",
        "9: name = 'adafactor' (a 'paper' label cites no mt entry)",
        "10: clipping_threshold = 1.0 (a 'paper' label cites no mt entry)",
    ]


def test_every_gin_file_of_a_paper_recipe_is_checked():
    # A paper recipe file added later is labelled too: every gin file that names a paper in its
    # first comment line is in PAPER_FILES.
    named = {
        str(p.relative_to(CONFIGS))
        for p in CONFIGS.rglob("*.gin")
        if re.search(r"(CPT|MT) paper", p.read_text().split("\n", 1)[0])
    }
    assert named <= set(PAPER_FILES), sorted(named - set(PAPER_FILES))
