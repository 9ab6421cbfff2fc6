"""The MT findings' wording when a manifest finetunes every Df under two recipes (mt_paper's
FINETUNE_RECIPE axis): Df varies at fixed lengths, one series per recipe, not "Df and length
vary together"."""

import numpy as np

from studies.mt_findings import Cell, finetune_design


def _cell(df: int, steps: int) -> Cell:
    return Cell(
        mixture="mix_en_50_de_50",
        task="mt_en_de",
        df=df,
        steps=f"{steps} steps, Df {df}",
        Dp=np.array([1.0, 2.0]),
        init_steps=(1, 2),
        values={"bleu": np.array([10.0, 12.0])},
        baseline={},
        runs=("a", "b"),
        alignment=1.0,
        train_steps=steps,
    )


def test_two_recipes_at_every_df_keep_df_the_only_difference_within_a_series():
    cells = [_cell(df, n) for df in (6_000_000, 31_000_000) for n in (300, 2**18)]
    text, fixed = finetune_design(cells)
    assert fixed
    assert "fixed 300 finetuning steps (FINETUNE_RECIPE 'paper_300') and at 262144" in text
    assert "(FINETUNE_RECIPE 'raffel_2^18'), each Df under each" in text
    # A recipe missing at one Df: the lengths differ between Df, and the text says they mix.
    text, fixed = finetune_design(cells[:3])
    assert not fixed and "vary together" in text


def test_a_paper_300_finetune_with_comet_parses_as_the_trainer_reads_it():
    # mt_paper's 300-step recipe under xlscale's trainer, with the COMET settings given: 300
    # steps, evaluated and decoded every 50, the recipe recorded, COMET configured for decoding.
    import gin
    from gin_values import resolve

    from launch import sweep
    from trainer import gin_entry

    model = "/m/wmt22-comet-da/checkpoints/model.ckpt"
    variables = {"DATA_DIR": "/d", "VOCAB_PATH": "/v", "COMET_MODEL": model}
    runs = sweep.expand(sweep.load_manifest("mt_paper", variables=variables))
    run = next(
        r
        for r in runs
        if r.strategy == "finetune_scratch" and r.coord("FINETUNE_RECIPE") == "paper_300"
    )
    gin.clear_config()
    try:
        gin_entry.parse(run.gin_args(), job="train")
        assert resolve("TRAIN_STEPS") == run.steps == 300
        assert (resolve("EVAL_PERIOD"), resolve("DECODE_PERIOD")) == (50, 50)
        assert resolve("FINETUNE_RECIPE") == "paper_300" and resolve("EVAL_AT_START") is True
        assert (resolve("COMET_MODEL"), resolve("COMET_PYTHON")) == (model, None)
    finally:
        gin.clear_config()
