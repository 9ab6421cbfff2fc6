"""What the two papers say, in their own words: every claim the project attributes to a paper.

A text of the project (a docstring, a report, a gin comment, a manifest) that says what a paper
says, does or prints cites an entry of `QUOTES` by its key, written `[q:<key>]` (e.g.
`[q:mt.s4_finetune]`); the entry holds the paper, where in it (section, table, figure, appendix)
and its exact words. What the project reads into a paper's words, or chooses where the paper is
silent, is written as ours ("we read Dp as ... because ...", "ours: T5X's default"), never as the
paper's.

- `QUOTES`: key -> `Quote`. Keys are `<paper>.<place>_<what>`; `paper` is a key of `PAPERS`.
- A quote's words are verbatim from the paper's text, whitespace aside (the papers' text as
  extracted: its LaTeX and its table cells kept as they are); " … " separates verbatim fragments of
  one passage where words between them are left out (garbled formulas, links).
- `cite(key)`: the quote as a report prints it: `CPT paper §1: "…"`.
- `cited(text)`: the keys a text cites; `problems(quotes)`: entries without a paper, a place or
  words (tests/test_paper_quotes.py fails on any, and on a citation of a key that is not here).
"""

from __future__ import annotations

import dataclasses
import re

PAPERS = {
    "cpt": "CPT paper",  # Zheng et al. 2024, Breaking Language Barriers: Cross-Lingual CPT at Scale
    "mt": "MT paper",  # Isik et al. 2024, Scaling Laws for Downstream Task Performance in MT
}
# `[q:<key>]`; one inside a code span (a backtick right before or after it) is an example, not a
# citation.
CITATION = re.compile(r"(?<!`)\[q:([A-Za-z0-9_.\-]+)\](?!`)")
ELLIPSIS = " … "
# A place in a paper: a section, table, figure, equation, appendix, remark or the abstract.
_PLACE = re.compile(
    r"(§\d|Tables? \d|Fig\. \d|eqs?\. \d|App\. [A-D]|Remark \d|Abstract|Limitations)"
)


@dataclasses.dataclass(frozen=True)
class Quote:
    """One passage of a paper.

    Attributes:
      paper: a key of `PAPERS`.
      where: where in the paper ("§4", "Table 2(a)", "App. A", "Fig. 2 caption").
      words: the paper's words, verbatim (whitespace aside; `ELLIPSIS` between fragments).
    """

    paper: str
    where: str
    words: str

    def fragments(self) -> list[str]:
        """The verbatim pieces of `words` (split at `ELLIPSIS`)."""
        return [f for f in self.words.split(ELLIPSIS) if f.strip()]


QUOTES: dict[str, Quote] = {
    # --- the CPT paper (Zheng et al. 2024) ---------------------------------------------------
    "cpt.abstract_sizes": Quote(
        "cpt",
        "Abstract",
        "Based on parallel experiments on 40 model sizes ranging from 40M to 5B parameters",
    ),
    "cpt.table1_caption": Quote(
        "cpt",
        "Table 1 caption",
        "All three sets of models are trained with identical parameter sizes, which cover 40 "
        "sizes spanning from 50M to 5.5B. Note that the batch size is based on token counts.",
    ),
    "cpt.table1_bands": Quote(
        "cpt",
        "Table 1",
        "50M-1B(23 models) ,1M … 1B-2.5B(12 models), 2M … 2.7B-5.5B(5 models), 4M",
    ),
    "cpt.table4_sizes": Quote(
        "cpt",
        "App. D, Table 4",
        "Table 4: Structural Parameters for Models of Different Sizes. … Parameter Size(M)Hidden "
        "Layer Size Intermediate Layer Attention Head Count Number of Layers … 49 512 3072 8 8 … "
        "5534 3072 16896 24 36",
    ),
    "cpt.s1_tokens_saved": Quote(
        "cpt",
        "§1",
        "Throughout the whole training process, CPT saves 25% to 50% of tokens when achieving the "
        "same loss.",
    ),
    "cpt.s1_lower_loss": Quote(
        "cpt",
        "§1",
        "CPT models of different sizes exhibit a power-law relationship between loss and compute "
        "similar to models trained from scratch, but achieve lower loss at each computational "
        "level. For models of a given parameter size, CPT consistently outperforms training from "
        "scratch, particularly during the initial stages.",
    ),
    "cpt.s1_languages": Quote(
        "cpt",
        "§1",
        "Specifically, we use English as the source language for the source model and Chinese as "
        "the target language for CPT.",
    ),
    "cpt.s1_example_5p5b": Quote(
        "cpt",
        "§1",
        "after training on 70B tokens, the 5.5B model with CPT reaches the same loss as a model "
        "trained from scratch with 110B tokens.",
    ),
    "cpt.s1_replay": Quote(
        "cpt",
        "§1",
        "CPT is susceptible to catastrophic forgetting; however, replaying 10% to 30% of the "
        "source language data effectively mitigates this issue.",
    ),
    "cpt.s2_1_tokens_20x": Quote(
        "cpt",
        "§2.1",
        "All models are pre-trained with a context length of 2048 and undergo training on tokens "
        "equivalent to 20 times the model size (e.g., a 5B model is trained on 100B tokens).",
    ),
    "cpt.s2_1_schedule": Quote(
        "cpt",
        "§2.1",
        "Our learning rate (LR) schedule features a cosine LR decay from a maximum LR of 2×10−4 … "
        "and an LR warm-up, which increases the LR to the maximum in the first 5% of the training "
        "session.",
    ),
    "cpt.s2_1_batch": Quote(
        "cpt",
        "§2.1",
        "We use different batch sizes for different parameter sizes, as shown in Table",
    ),
    "cpt.s2_1_identical": Quote(
        "cpt",
        "§2.1",
        "To simplify the experiments, we use identical training strategies for all three "
        "pre-training sets, including learning rate schedules, batch sizes and trained token "
        "counts.",
    ),
    "cpt.s2_2_architecture": Quote(
        "cpt",
        "§2.2",
        "We adopt the same decoder-only Transformer architecture as LLaMA2",
    ),
    "cpt.s2_2_tokenizer": Quote(
        "cpt",
        "§2.2",
        "our tokenizer is trained on the bilingual pre-training corpus we used for the CPT "
        "experiments. The tokenizer is trained with SentencePiece … and has a vocabulary size of "
        "36,152, including common Chinese word pieces.",
    ),
    "cpt.limitations_bpe": Quote(
        "cpt",
        "Limitations",
        "we used a byte-level BPE tokenizer trained on both English and Chinese text, keeping the "
        "model’s shape unchanged.",
    ),
    "cpt.s2_2_fr_ru": Quote(
        "cpt",
        "§2.2",
        "we also conduct experiments on other languages, including French and Russian. We take "
        "their corresponding subsets from mC4",
    ),
    "cpt.s2_3_zero_shot": Quote(
        "cpt",
        "§2.3",
        "All evaluations are performed under zero-shot settings. We report normalized accuracy as "
        "the metric for each task.",
    ),
    "cpt.table2_scratch": Quote(
        "cpt", "Table 2(a)", "Training from Scratch 1.55 420.0 719.5 0.40 0.30-"
    ),
    "cpt.table2_cpt": Quote(
        "cpt", "Table 2(a)", "Continual Pre-training 1.55 420.0 433.3 0.40 0.20 0.08"
    ),
    "cpt.table2_fixed": Quote(
        "cpt",
        "Table 2 caption",
        "For Continual Pre-Training, parameters … are fixed based on values from Training from "
        "Scratch.",
    ),
    "cpt.table2b": Quote(
        "cpt",
        "Table 2(b)",
        "Training from Scratch 0.429 0.571 … Continual Pre-training 0.385 0.615",
    ),
    "cpt.s3_2_fixed": Quote(
        "cpt", "§3.2", "Note that we do not update … during optimization for CPT."
    ),
    "cpt.s3_3_huber": Quote(
        "cpt", "§3.3", "we minimize the Huber loss … between predicted and observed log loss"
    ),
    "cpt.s3_3_optuna": Quote(
        "cpt",
        "§3.3",
        "We use the Optuna library for hyperparameter search and the L-BFGS algorithm",
    ),
    "cpt.s4_1_gap": Quote(
        "cpt",
        "§4.1",
        "At the start of training, CPT converges significantly faster, advancing pre-training "
        "from scratch by orders of magnitudes. The absolute difference of loss becomes smaller as "
        "training continues, but a substantial gap in loss persists.",
    ),
    "cpt.s4_2_eq3_fit": Quote(
        "cpt",
        "§4.2",
        "We conducted parametric fits for CPT and pre-training from scratch on Equation … using "
        "the lowest loss at each compute level.",
    ),
    "cpt.s4_2_eq3_values": Quote(
        "cpt",
        "§4.2",
        "For pre-training from scratch, the relationship is represented by L=33.69907×C−0.0579 … "
        "the loss for CPT is lower, described by L=31.9594×C−0.0575",
    ),
    "cpt.s4_2_unchanged": Quote(
        "cpt", "§4.2", "the nearly unchanged exponent (from -0.0579 to -0.0575)"
    ),
    "cpt.s4_2_initial_condition": Quote(
        "cpt",
        "§4.2",
        "The nearly unchanged exponent suggests that CPT does not alter the underlying dynamics "
        "of the loss-compute relationship, but rather provides an advantageous initial condition.",
    ),
    "cpt.s4_3_params": Quote("cpt", "§4.3", "For CPT, the parameters are B=433"),
    "cpt.s4_3_flops_saved": Quote(
        "cpt",
        "§4.3",
        "We find that the percentage of reduced training FLOPs steadily decreases during the "
        "individual training process, resulting in 25% to 50% FLOPs saved during CPT.",
    ),
    "cpt.fig2_caption": Quote(
        "cpt",
        "Fig. 2 caption",
        "Percentage reduction in FLOPs … at the same loss level for both strategies.",
    ),
    "cpt.s4_4_languages": Quote(
        "cpt",
        "§4.4",
        "Using 1.4B parameters, we continually trained models in French (Fr.), Russian (Ru.), and "
        "Chinese (Zh) from the same English checkpoint and compared them to models trained from "
        "scratch and the original English checkpoints.",
    ),
    "cpt.s5_1_eqs8_9": Quote(
        "cpt",
        "§5.1, eqs. 8-9",
        "=0.324C 0.429 … =0.514C 0.571 … =4.79C 0.385 … =0.035C 0.615",
    ),
    "cpt.s5_2_forgetting": Quote(
        "cpt",
        "§5.2",
        "For example, in a 1.4 billion parameter model, the validation loss on English increases "
        "from 2.40 to 3.68 during pre-training.",
    ),
    "cpt.s5_2_low_replay": Quote(
        "cpt",
        "§5.2",
        "Validation losses of models at different English replaying ratios increase at the early "
        "stage of training and then decline, eventually returning to a lower value than at the "
        "start. This suggests that a large amount of original knowledge is preserved throughout "
        "continual training, even with a very low English replaying ratio (1% - 5%).",
    ),
    "cpt.fig4_ratios": Quote(
        "cpt",
        "Fig. 4 caption",
        "Models with English replaying ratios of 1%, 5%, 10%, 20%, 50%, and 80% are shown from "
        "light to dark blue, respectively.",
    ),
    "cpt.s7_saving": Quote(
        "cpt",
        "§7",
        "Our results quantitatively demonstrate that CPT achieves lower loss more quickly, saving "
        "25% to 50% of training resources.",
    ),
    "cpt.appA_30pct": Quote(
        "cpt",
        "App. A",
        "In practice, around 30% of original data is sufficient to keep the validation loss "
        "lower than at the start of continual pre-training.",
    ),
    "cpt.appA_optimal": Quote(
        "cpt",
        "App. A",
        "An optimal ratio is around 30% English data, balancing low validation loss and high "
        "relative performance across both languages.",
    ),
    "cpt.fig6_relative": Quote(
        "cpt",
        "Fig. 6 caption",
        "Relative Performance refers to accuracy relative to the highest accuracy achieved across "
        "different training settings with 1.4B parameters.",
    ),
    "cpt.appB_procedure": Quote(
        "cpt",
        "App. B",
        "The fitting process minimized the average loss across all trained models for both "
        "strategies using the same procedures described in Section",
    ),
    "cpt.appB_table3": Quote(
        "cpt",
        "App. B, Table 3",
        "Fit Data Pre-Training CPT … 0.0090 0.0108 … 0.0094 0.0093 … -0.005 0.080",
    ),
    "cpt.appB_gamma": Quote(
        "cpt",
        "App. B",
        "for continual pre-training, the joint data-parameter term in the extended scaling law "
        "significantly reduces the fitting error, with γ=0.080",
    ),
    # --- the MT paper (Isik et al. 2024) -----------------------------------------------------
    "mt.s1_models": Quote(
        "mt",
        "§1",
        "We carry out systematic experiments on 770-million and 3-billion encoder-decoder T5 "
        "(Raffel et al., 2020) models",
    ),
    "mt.eq1_log_law": Quote(
        "mt",
        "§3.1, eq. 1",
        r"$$f(D_p) = (\log(A \cdot D_p^\alpha))^\beta, \quad (1)$$ … where A , α , and β are "
        "coefficients to be fit.",
    ),
    "mt.eq3_ce_law": Quote(
        "mt",
        "§3.3, eq. 3",
        r"$$L(D_p) = E + \frac{A}{D_p^\alpha}, \quad (3)$$ … where E , A , and α are the "
        "coefficients to be optimized.",
    ),
    "mt.s3_4_ce_monotone": Quote(
        "mt",
        "§3.4",
        "While the cross-entropy loss always follows a monotonically decreasing trend which can "
        "be captured by the scaling law in (3), we do not always see a monotonic increase in the "
        "translation scores when increasing the pretraining dataset size",
    ),
    "mt.s4_one_pass": Quote(
        "mt",
        "§4",
        "In the experiments, we first pretrain a model without doing more than one pass over any "
        "of the examples. Then, we finetune selected checkpoints of the pretrained model. "
        "Naturally, there is a one-to-one mapping between the checkpoint number and the number "
        "of pretraining tokens seen.",
    ),
    "mt.s4_model_3b": Quote(
        "mt",
        "§4",
        "We use the 3-billion encoder-decoder T5 model with 24 encoder layers, 24 decoder layers, "
        "embedding dimension 1024, and 32 heads with dimension 128.",
    ),
    "mt.s4_model_770m": Quote(
        "mt",
        "§4",
        "In Appendix C, we also provide results with the 770-million encoder-decoder T5 model. "
        "This model corresponds to T5-Large in Raffel et al. (2020).",
    ),
    "mt.s4_vocab": Quote(
        "mt",
        "§4",
        "we use SentencePiece (Kudo & Richardson, 2018) trained with a vocabulary of size 250, "
        "112 that covers all the languages in the MC4 dataset",
    ),
    "mt.s4_mixture_batch": Quote(
        "mt",
        "§4",
        "meaning that 50% of one pretraining batch is sampled from en-MC4 and the other 50% is "
        "sampled from the other language.",
    ),
    "mt.s4_wmt_sizes": Quote(
        "mt",
        "§4",
        "We finetune the pretrained models on WMT-17 en-de with 3B tokens (Bojar et al., 2017), "
        "WMT-15 en-fr with 21B tokens (Bojar et al., 2014), and WMT-16 en-ro with 312M tokens "
        "(Bojar et al., 2016), separately.",
    ),
    "mt.s4_subsample": Quote(
        "mt",
        "§4",
        "we sometimes use a smaller randomly sampled portion from these translation datasets and "
        "indicate the number of tokens used in the plots.",
    ),
    "mt.s4_superglue": Quote(
        "mt",
        "§4",
        "For this, we analyze models pretrained on en-MC4 and finetuned on SuperGLUE (Wang et al., "
        "2019), which includes several classes of tasks such as question answering (BoolQ, "
        "MultiRC), reasoning (COPA), reading comprehension (ReCoRD), and textual entailment (RTE).",
    ),
    "mt.s4_pretrain": Quote(
        "mt",
        "§4",
        "During pretraining, we use a batch size of 256 and a sequence length of 512 for 1, 000, "
        "000 steps except for the ro-MC4 pretraining. For ro-MC4, we pretrain for 510, 000 steps "
        "since otherwise, we would need to do repetitions over the sequences.",
    ),
    "mt.s4_lr_schedule": Quote(
        "mt",
        "§4",
        "Following Raffel et al. (2020), we use an “inverse square root” learning rate schedule, "
        r"$\frac{1}{\sqrt{\max(n, k)}}$, where n is the current pretraining step and $k = 10^4$.",
    ),
    "mt.s4_base_lr": Quote(
        "mt",
        "§4",
        r"We do a grid search for the base learning rate from $\{0.05, 0.1, 0.5, 1.0, 2.0, 5.0\}$ "
        "and pick the best one for each pretrained model based on *upstream* cross entropy.",
    ),
    "mt.s4_full_weight": Quote("mt", "§4", "We perform full-weight finetuning."),
    "mt.s4_finetune": Quote(
        "mt",
        "§4",
        "During finetuning, again following Raffel et al. (2020), we use a batch size of 128 and "
        "a sequence length of 512 for 300 steps.",
    ),
    "mt.s4_finetune_lr": Quote(
        "mt",
        "§4",
        r"We use a constant learning rate by selecting the best from $\{0.001, 0.005, 0.01, "
        r"0.05, 0.1\}$.",
    ),
    "mt.s4_adafactor": Quote(
        "mt", "§4", "In both stages, we use AdaFactor optimizer (Shazeer & Stern, 2018)."
    ),
    "mt.s4_huber": Quote(
        "mt",
        "§4",
        r"we use $\delta = 0.1$ for the translation scores and $\delta = 1e-3$ for the "
        "*downstream* cross-entropy loss.",
    ),
    "mt.s4_first_four": Quote(
        "mt",
        "§4",
        "To optimize the coefficients, we use the first four data points that require the "
        "smallest amount of pretraining data and leave the remaining data points as held-out "
        "data to evaluate the accuracy of the laws.",
    ),
    "mt.s4_error_via_huber": Quote(
        "mt",
        "§4",
        "We select the best fit among a grid of initializations and report the prediction error "
        "computed via the Huber loss in Appendix C.3.",
    ),
    "mt.s5_error_bounds": Quote(
        "mt",
        "§5",
        r"with prediction error at most 0.061 for the BLEU score ($\delta = 0.1$) and "
        r"$5.95e-12$ for the *downstream* cross-entropy ($\delta = 1e-3$)",
    ),
    "mt.s5_error_en_de_ro": Quote(
        "mt",
        "§5",
        "the scaling law fits well to the pretraining data with prediction error at most 0.025 "
        r"for these tasks ($\delta = 0.1$)",
    ),
    "mt.fig5_caption": Quote(
        "mt",
        "Fig. 5 caption",
        "For en-de translation task, we see a consistent correlation between the two metrics for "
        "all the pretraining datasets. … For en-fr translation task, the two metrics usually "
        "show an arbitrary relation.",
    ),
    "mt.remark1_aligned": Quote(
        "mt",
        "Remark 1",
        "For both en-de and en-fr tasks, 100% en-MC4 leads to significantly worse BLEU score and "
        "*downstream* cross-entropy than the more aligned 50% en-MC4 + 50% de/fr-MC4 balanced "
        "datasets, respectively.",
    ),
    "mt.remark2_bp": Quote(
        "mt",
        "Remark 2",
        r"In all the experiments, we observe $\text{brevity-penalty} = 1$, i.e., the "
        "non-monotonic behavior comes from the precision term, not the brevity penalty.",
    ),
    "mt.appA_timing": Quote(
        "mt",
        "App. A",
        "For the T5-3B experiments, pretraining for 1M steps takes 15-20 hours and finetuning "
        "takes 5-7 hours on an 8x8 TPU. For the sake of anonymity, we are unable to provide "
        "further information on compute specifications at this time",
    ),
    "mt.appA2_delta": Quote(
        "mt",
        "App. A.2",
        r"we use $\delta = 0.1$ for BLEU score law in (1) and $\delta = 1e - 3$ for the "
        "*downstream* cross-entropy law in (3).",
    ),
    "mt.appA2_log_residuals": Quote(
        "mt",
        "App. A.2, eqs. 6-7",
        r"\ell_{\delta}(\log f_i, \log \hat{f}(D_{pi})), \quad (6)$$ … "
        r"\ell_{\delta}(\log L_i, \log \hat{L}(D_{pi})), \quad (7)$$",
    ),
    "mt.appB_tasks": Quote(
        "mt",
        "App. B",
        "Figure 6 demonstrates how SuperGLUE (Wang et al., 2019) task metrics such as Boolean "
        "Questions (BoolQ) … CommitmentBank (CB) … Choice of Plausible Alternatives (COPA) … "
        "Multi-Sentence Reading Comprehension (MultiRC) … Recognizing Textual Entailment (RTE) … "
        "Reading Comprehension with Commonsense Reasoning Dataset (ReCoRD) … and Word-in-Context "
        "(WiC) … scale as the pretraining data grows.",
    ),
    "mt.appB_recipe": Quote(
        "mt",
        "App. B",
        "For these experiments, we use T5-3B model pretrained on en-MC4 data (same as Section 5). "
        "For finetuning on SuperGLUE, we use a batch size of 128 and a sequence length of 512 "
        r"for 300 steps. We use a constant learning rate by selecting the best from $\{0.001, "
        r"0.005, 0.01, 0.05, 0.1, 0.5\}$.",
    ),
    "mt.tables_log_a": Quote(
        "mt",
        "Tables 3 and 5 captions",
        "We report $\\log A$ instead of A since A typically takes very small and very large "
        "values.",
    ),
    "mt.tables_ce_delta": Quote(
        "mt",
        "Tables 4 and 6 captions",
        r"For the *downstream* cross-entropy laws, we use $\delta = 10^{-5}$ for the Huber Loss.",
    ),
    "mt.table3_ro_3m": Quote(
        "mt",
        "App. C.3, Table 3",
        "50% en + 50% ro-MC4 WMT-16 en-ro 3M -0.115.03 5.69 0.89 0.015",
    ),
}


def quote(key: str) -> Quote:
    """The entry `key`.

    Raises:
      KeyError: no such entry, naming the key.
    """
    if key not in QUOTES:
        raise KeyError(f"no paper quote {key!r} (fitting.paper_quotes.QUOTES)")
    return QUOTES[key]


def cite(key: str) -> str:
    """The quote as a report prints it: `<paper> <where>: "<words>"`."""
    q = quote(key)
    return f'{PAPERS[q.paper]} {q.where}: "{q.words}"'


def cited(text: str) -> list[str]:
    """The keys `text` cites (`[q:<key>]`), in order."""
    return CITATION.findall(text)


def problems(quotes: dict[str, Quote]) -> list[str]:
    """`key: what is missing` for every entry without a known paper, a place (section, table,
    figure, appendix) or words; empty when every entry is complete."""
    bad = []
    for key, q in quotes.items():
        if q.paper not in PAPERS:
            bad.append(f"{key}: paper {q.paper!r} is none of {sorted(PAPERS)}")
        if not key.startswith(f"{q.paper}."):
            bad.append(f"{key}: the key does not start with its paper, {q.paper!r}")
        if not _PLACE.search(q.where or ""):
            bad.append(f"{key}: no section, table, figure or appendix in where={q.where!r}")
        if not q.fragments():
            bad.append(f"{key}: no words")
    return bad
