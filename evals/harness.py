"""The `xlscale` model of lm-evaluation-harness: a run's orbax checkpoint and SentencePiece
vocabulary behind lm-eval's `LM` interface, and `evaluate`, which scores tasks with it.

    from evals import harness                       # registers the model as `xlscale`
    harness.evaluate(model_dir="/runs/cpt_zh_49m", step=None, tasks=["xnli_zh"])

    python -m evals.lm_eval_cli run --model xlscale \\
        --model_args model_dir=/runs/cpt_zh_49m,step=2000 --tasks xnli_zh,xstorycloze_zh

Tokenisation follows lm-eval's HF causal model: trailing spaces of a context move to the
continuation, the pair is encoded whole and split at the context's length, and a context gives
way on the left when the pair is longer than the model's context. Every context starts with the
decoder's start token (`Scorer.start_id`), as every training document does.
`loglikelihood_rolling` uses lm-eval's own rolling windows with that start token as prefix.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Collection, Sequence
from typing import Any

from lm_eval.api.model import LM
from lm_eval.api.registry import model_registry
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from evals import scorer as scorer_lib

log = logging.getLogger(__name__)

MODEL_NAME = "xlscale"
# Multiple-choice accuracy and its length-normalised form (lm-eval's metric names).
ACC_METRICS = [
    {"metric": "acc", "aggregation": "mean", "higher_is_better": True},
    {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True},
]
DEFAULT_BATCH_SIZE = 16


def _batch_size(value: Any) -> int:
    """lm-eval passes `--batch_size` as given (`8`, `"8"`, `"auto"`); `auto` has no meaning
    for a fixed-shape compiled step, so it becomes the default with a log line."""
    if value is None:
        return DEFAULT_BATCH_SIZE
    if isinstance(value, int) or str(value).isdigit():
        return int(value)
    log.info("batch_size=%r: using %d rows per batch (no auto sizing)", value, DEFAULT_BATCH_SIZE)
    return DEFAULT_BATCH_SIZE


def _flag(value: Any) -> bool:
    return str(value).lower() not in ("0", "false", "no", "off")


class XlscaleLM(LM):
    """An xlscale run's checkpoint as an lm-eval model.

    Args (lm-eval `--model_args`):
      model_dir: the run directory (`run.json`, `checkpoints/`).
      step: a kept checkpoint step (default: the latest).
      batch_size: rows scored together (lm-eval's `--batch_size`).
      bucket: pad batches to power-of-two lengths (default true) or to the full context.
      vocab_path: the SentencePiece model, when the run's recorded path has moved.
      max_gen_toks: default generation length of `generate_until`.
    """

    def __init__(
        self,
        model_dir: str,
        step: int | str | None = None,
        batch_size: int | str | None = None,
        bucket: bool | str = True,
        vocab_path: str | None = None,
        max_gen_toks: int | str = 64,
        **unused: Any,
    ):
        super().__init__()
        unused = {k: v for k, v in unused.items() if v is not None}
        unused.pop("max_batch_size", None)
        if unused.pop("device", None) not in (None, "", "cpu", "cuda", "tpu"):
            log.info("device= is ignored: JAX places the model on its default backend")
        if unused:
            raise ValueError(
                f"--model_args {', '.join(sorted(unused))}: not arguments of the xlscale model "
                "(allowed: model_dir, step, batch_size, bucket, vocab_path, max_gen_toks)"
            )
        spec = scorer_lib.read_run_spec(model_dir, vocab_path=vocab_path)
        self.scorer = scorer_lib.Scorer(
            spec,
            step=None if step in (None, "", "latest") else int(step),
            batch_size=_batch_size(batch_size),
            bucket=_flag(bucket),
        )
        self.max_gen_toks = int(max_gen_toks)

    @property
    def step(self) -> int:
        """The checkpoint step being scored."""
        return self.scorer.step

    @property
    def tokenizer_name(self) -> str:
        """The vocabulary file (lm-eval records it with cached requests)."""
        return os.path.basename(self.scorer.spec.vocab_path)

    def encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """Context ids (start token first) and continuation ids, split as lm-eval's HF causal
        model splits them (trailing context spaces belong to the continuation)."""
        start = [self.scorer.start_id]
        if not context:
            return start, self.scorer.encode(continuation)
        n_spaces = len(context) - len(context.rstrip())
        if n_spaces:
            continuation = context[-n_spaces:] + continuation
            context = context[:-n_spaces]
        whole = self.scorer.encode(context + continuation)
        context_ids = self.scorer.encode(context)
        continuation_ids = whole[len(context_ids) :] or self.scorer.encode(continuation)
        return start + context_ids, continuation_ids

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """`(log P(continuation | context), is_greedy)` per request."""
        pairs = [self.encode_pair(*req.args) for req in requests]
        results = self.scorer.score(pairs)
        for req, result in zip(requests, results, strict=True):
            self.cache_hook.add_partial("loglikelihood", req.args, result)
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Log-likelihood of each whole string, over lm-eval's disjoint rolling windows of the
        model's context."""
        windows: list[tuple[list[int], list[int]]] = []
        owner: list[int] = []
        for i, req in enumerate(requests):
            tokens = self.scorer.encode(req.args[0])
            for window in get_rolling_token_windows(
                token_list=tokens,
                prefix_token=self.scorer.start_id,
                max_seq_len=self.scorer.max_len,
                context_len=1,
            ):
                windows.append(make_disjoint_window(window))
                owner.append(i)
        totals = [0.0] * len(requests)
        for i, (logprob, _) in zip(owner, self.scorer.score(windows), strict=True):
            totals[i] += logprob
        for req, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy continuations through the project's decoder, cut at the first `until` string
        (lm-eval's `gen_kwargs`: `until`, `max_gen_toks`; sampling is not supported)."""
        groups: dict[int, list[int]] = {}
        for i, req in enumerate(requests):
            kwargs = dict(req.args[1] or {})
            if kwargs.get("do_sample") or float(kwargs.get("temperature") or 0.0) > 0:
                raise ValueError(
                    f"gen_kwargs {kwargs}: the xlscale model decodes greedily only "
                    "(do_sample=false, temperature=0)"
                )
            groups.setdefault(int(kwargs.get("max_gen_toks", self.max_gen_toks)), []).append(i)
        out = [""] * len(requests)
        for max_new, indices in groups.items():
            contexts = [self.scorer.encode(requests[i].args[0]) or [] for i in indices]
            ids = self.scorer.generate(contexts, max_new_tokens=max_new)
            for i, generated in zip(indices, ids, strict=True):
                text = self.scorer.decode(generated)
                out[i] = cut_at_stop(text, _until(requests[i].args[1]))
                self.cache_hook.add_partial("generate_until", requests[i].args, out[i])
        return out


def _until(gen_kwargs: dict | None) -> list[str]:
    until = (gen_kwargs or {}).get("until") or []
    return [until] if isinstance(until, str) else list(until)


def cut_at_stop(text: str, stops: Sequence[str]) -> str:
    """`text` up to the earliest of the stop strings (lm-eval's `until`)."""
    cut = len(text)
    for stop in stops:
        if stop:
            found = text.find(stop)
            if found != -1:
                cut = min(cut, found)
    return text[:cut]


def register() -> None:
    """Registers `XlscaleLM` as lm-eval's model `xlscale` (a lazy placeholder
    `evals.harness:XlscaleLM` registered earlier, by `evals.lm_eval_cli`, is upgraded to the
    class); an existing registration of another class is left alone with a log line."""
    try:
        model_registry.register(MODEL_NAME)(XlscaleLM)
    except ValueError as err:
        log.info("lm-eval model %r already registered: %s", MODEL_NAME, err)


register()


def with_acc_norm(manager: Any, task: str) -> dict[str, Any] | str:
    """`task`'s full config (its YAML, includes resolved) with `acc` and `acc_norm` as its
    metrics, as an inline task spec: lm-eval builds a dict spec as the whole config, not as an
    override of the registered task. A task lm-eval does not index, or defines in Python, is
    returned by name unchanged."""
    from lm_eval.tasks._yaml_loader import load_yaml

    entry = manager.task_index.get(task)
    if entry is None or not getattr(entry, "yaml_path", None):
        return task
    config = dict(load_yaml(entry.yaml_path, resolve_func=True))
    if "class" in config:
        return task
    for key in ("tag", "group", "task_list"):
        config.pop(key, None)
    return {**config, "task": task, "metric_list": ACC_METRICS}


@contextlib.contextmanager
def _no_progress_bars():
    """Silences the progress bars of `datasets` (building each task's split) and of lm-eval
    (building each task's requests) while scoring: they would land between the project's own
    progress lines, one set per task and checkpoint. The scorer reports its own cost. Also
    keeps git's complaint off the terminal (`quiet_git_hash`)."""
    import functools

    import datasets.utils.logging as datasets_logging
    import lm_eval.api.task as lm_eval_task
    import lm_eval.evaluator as lm_eval_evaluator

    was_enabled = datasets_logging.is_progress_bar_enabled()
    original = lm_eval_task.tqdm
    original_hash = lm_eval_evaluator.get_git_commit_hash
    datasets_logging.disable_progress_bar()
    lm_eval_task.tqdm = functools.partial(original, disable=True)
    lm_eval_evaluator.get_git_commit_hash = quiet_git_hash
    try:
        yield
    finally:
        lm_eval_task.tqdm = original
        lm_eval_evaluator.get_git_commit_hash = original_hash
        if was_enabled:
            datasets_logging.enable_progress_bar()


def quiet_git_hash() -> str | None:
    """`git describe --always` of the working directory, or None outside a git repository.

    What lm-eval records as its results' `git_hash`, asked with git's stderr captured: lm-eval
    lets git write `fatal: not a git repository` to the terminal once per scoring whenever the
    working directory is not a checkout (a run directory, a job's scratch space)."""
    import subprocess

    try:
        done = subprocess.run(
            ["git", "describe", "--always"], capture_output=True, text=True, check=True
        )
    except (subprocess.CalledProcessError, FileNotFoundError):
        return None
    return done.stdout.strip() or None


def evaluate(
    *,
    model_dir: str,
    step: int | None,
    tasks: Sequence[str],
    include_path: str | None = None,
    limit: int | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    bucket: bool = True,
    num_fewshot: int = 0,
    vocab_path: str | None = None,
    include_defaults: bool = True,
    normalise: Collection[str] | None = None,
) -> dict[str, Any]:
    """Scores the checkpoint on `tasks` zero-shot through `lm_eval.simple_evaluate`.

    Args:
      include_path: a directory of task YAML (the local tasks) added to lm-eval's own.
      limit: at most this many items per task (lm-eval's `--limit`).
      vocab_path: the run's SentencePiece model, when the recorded path has moved.
      include_defaults: index lm-eval's own ~15k tasks too (4 s); False for local tasks only.
      normalise: tasks whose metric list is replaced by `acc` and `acc_norm` (default: the
        paper's benchmarks, `evals.paper_tasks.CHANCE`; lm-eval 0.4.13 lists only `acc` for
        XNLI, XWinograd, XStoryCloze and XCOPA, and the CPT paper reports `acc_norm`).

    Returns:
      `{"results", "n-samples", "versions", "configs", "scorer", "step"}`: lm-eval's results
      per task, item counts, task versions and configs, and the scorer's cost
      (`evals.scorer.ScoreStats.to_json`).
    """
    import datasets.config
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    from evals import paper_tasks

    # `datasets` sends a download-count HEAD request to its S3 bucket for every dataset it
    # loads, the local JSON tasks included (found by the tests' no-egress guard): scoring needs
    # no network beyond fetching the benchmarks themselves, so the telemetry is off.
    datasets.config.HF_UPDATE_DOWNLOAD_COUNTS = False
    lm = XlscaleLM(
        model_dir=model_dir, step=step, batch_size=batch_size, bucket=bucket, vocab_path=vocab_path
    )
    manager = TaskManager(include_path=include_path, include_defaults=include_defaults)
    normalise = set(paper_tasks.CHANCE if normalise is None else normalise)
    specs = [with_acc_norm(manager, task) if task in normalise else task for task in tasks]
    with _no_progress_bars():
        out = simple_evaluate(
            model=lm,
            tasks=specs,
            num_fewshot=num_fewshot,
            limit=limit,
            task_manager=manager,
            log_samples=False,
            bootstrap_iters=1000,  # closed-form stderr for acc/acc_norm; bootstrap only for others
        )
    return {
        "results": out["results"],
        "n-samples": out.get("n-samples", {}),
        "versions": out.get("versions", {}),
        "configs": {
            task: {k: cfg.get(k) for k in ("task", "dataset_path", "output_type", "metadata")}
            for task, cfg in (out.get("configs") or {}).items()
        },
        "scorer": lm.scorer.stats.to_json(),
        "step": lm.step,
    }
