"""A synthetic runs directory with zero-shot scores (`zeroshot_runs_dir`): source, CPT and
scratch runs of two sizes in zh, fr and ru and three CPT-with-replay runs, scored as
`zeroshot_acc` says."""

from __future__ import annotations

import json

from rundir import records, zeroshot

SMALL, LARGE = 1.0e8, 1.4e9
TASKS = {"en": ("hellaswag", "arc_easy"), "zh": ("xcopa_zh", "xstory_zh")}
TASKS |= {"fr": ("xnli_fr",), "ru": ("xstory_ru", "xwino_ru")}


def zeroshot_acc(strategy: str, size: float, task: str, ratio: float) -> float:
    """Distinct, ordered scores: CPT > scratch > source on target tasks, bigger is better."""
    base = {"source": 0.30, "scratch": 0.35, "cpt": 0.40, "cpt_replay": 0.40}[strategy]
    lang = next(k for k, v in TASKS.items() if task in v)
    if lang == "en":
        base = 0.6 - 0.2 * (1 - ratio) if strategy in ("cpt", "cpt_replay") else 0.55
    elif strategy == "cpt_replay":
        base -= 0.1 * ratio
    return base + (0.05 if size == LARGE else 0.0) + 0.01 * len(task) % 0.03


def write_scored_run(root, name, *, strategy, target, size, ratio=0.0, scored=True):
    info = {
        "strategy": strategy,
        "target_lang": target,
        "source_lang": "en",
        "replay_ratio": ratio,
        "params_non_embedding": size,
        "model": f"m{int(size / 1e6)}M",
    }
    recs = [
        {"step": s, "tokens": 1000 * s, f"eval/lm_{target}/loss": 3.0 - s / 100} for s in (1, 50)
    ]
    path = records.write_run(root / name, info=info, records=recs)
    if scored:
        tasks = {
            t: {
                "acc": 0.5,
                "acc_norm": zeroshot_acc(strategy, size, t, ratio),
                "n": 200,
                "language": lang,
                "chance": 0.25,
            }
            for lang in (TASKS if strategy == "source" else {"en", target})
            for t in TASKS[lang]
        }
        for step in (10, 50):  # the latest scored step is the one reported
            data = {"format": zeroshot.FORMAT, "step": step, "tasks": tasks}
            if step == 10:
                data = json.loads(json.dumps(data).replace('"acc_norm": 0.', '"acc_norm": 0.0'))
            zeroshot.write_results_file(path, data)


def zeroshot_runs_dir(tmp_path, *, scored=True):
    root = tmp_path / "runs"
    for size in (SMALL, LARGE):
        write_scored_run(
            root, f"source_en_{size:.0e}", strategy="source", target="en", size=size, scored=scored
        )
        for lang in ("zh", "fr", "ru"):
            for strategy in ("cpt", "scratch"):
                write_scored_run(
                    root,
                    f"{strategy}_{lang}_{size:.0e}",
                    strategy=strategy,
                    target=lang,
                    size=size,
                    scored=scored,
                )
    for ratio in (0.1, 0.3, 0.5):
        write_scored_run(
            root,
            f"replay_zh_{ratio}",
            strategy="cpt_replay",
            target="zh",
            size=LARGE,
            ratio=ratio,
            scored=scored,
        )
    return root
