"""Subsets of the papers' synthetic study (`studies.paper_study`) that several tests fit."""

from studies import paper_study, paper_truth


def en_de_balanced_runs(root):
    """mt_paper's runs at the grid's best learning rates only (the select stage's choice; the
    other candidates would be further points at the same Dp) that make the balanced en-de 6M
    series: the en 50 / de 50 pretraining runs, their en-de 6M finetunes and the baselines."""
    runs = paper_study.expand_manifests(paper_study.MT_MANIFESTS, runs_dir=root)
    best = [r for r in runs if all(r.coord(k) in (None, v) for k, v in paper_truth.BEST_LR.items())]
    return [
        r
        for r in best
        if (r.strategy == "pretrain" and r.coord("mixture") == "mix_en_50_de_50")
        or (
            r.coord("task") == "mt_en_de"
            and r.coord("finetune_tokens") == 6_000_000
            and r.coord("mixture") in (None, "mix_en_50_de_50")
        )
    ]
