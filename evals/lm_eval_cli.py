"""lm-evaluation-harness's own command line with the `xlscale` model registered:

    python -m evals.lm_eval_cli --model xlscale \\
        --model_args model_dir=/runs/cpt_zh_49m,step=2000 --tasks xnli_zh,xstorycloze_zh

lm-eval 0.4.13 finds models only in its registry and has no plugin entry points, so
`python -m lm_eval` itself cannot know a model defined outside it; this module registers
`xlscale` (lazily: `evals.harness` and JAX load only when the model is asked for) and hands every
argument to lm-eval's CLI unchanged (`run`, `ls`, `validate`, `--include_path`, ...).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

TARGET = "evals.harness:XlscaleLM"


def register_lazily() -> None:
    """Registers `xlscale` in lm-eval's model registry as a lazy placeholder, after lm-eval's
    own models (its registry loads them only while empty)."""
    import lm_eval.models  # noqa: F401  (fills the registry with lm-eval's own models)
    from lm_eval.api.registry import model_registry

    if "xlscale" not in model_registry:
        model_registry.register("xlscale", target=TARGET)


def main(argv: Sequence[str] | None = None) -> int:
    """Runs lm-eval's CLI on `argv` (default: the process's arguments)."""
    from lm_eval.__main__ import cli_evaluate

    register_lazily()
    if argv is not None:
        sys.argv = [sys.argv[0], *argv]
    cli_evaluate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
