"""benchmarks/accelerator_step.py survives a short lease: each row its own child process, rows
streamed to JSON lines as they finish, failures (out of memory, a hang) as rows, a budget that
skips what cannot finish, and no TensorFlow/seqio/gin anywhere in parent or child. Runs on the
CPU backend at the tiny shapes; failures are injected before any compile (`INJECT_ENV`, test
only), so only two rows here pay a real compile."""

import importlib.util
import json
import math
import os
import pathlib
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from conftest import HOST_DEVICES_FLAG

REPO = pathlib.Path(__file__).resolve().parent.parent
PATH = REPO / "benchmarks" / "accelerator_step.py"
ROWS_PATH = REPO / "benchmarks" / "accelerator_rows.py"
LLAMA_NONE = "xlscale/llama2_tiny/none/auto/unpacked/b8"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("accelerator_step", PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def rows_module(bench):
    spec = importlib.util.spec_from_file_location("accelerator_rows", ROWS_PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def harness(bench):
    return bench.harness


def records(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def test_packed_rows_hold_several_documents(bench, rows_module):
    rng = np.random.default_rng(0)
    shape = bench.SHAPES[("t5", False)]
    batch = rows_module.synthetic_batch(rng, shape, vocab=512, packed=True)
    docs = batch["decoder_segment_ids"].max(axis=1)
    assert docs.min() >= 2 and batch["encoder_segment_ids"].max(axis=1).min() >= 2
    # Encoder and decoder rows pack the same examples.
    assert (docs == batch["encoder_segment_ids"].max(axis=1)).all()
    starts = batch["decoder_positions"] == 0
    assert (starts.sum(axis=1) == docs).all()


def test_peak_table(bench):
    assert bench.peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert bench.peak_flops("cpu") is None


def test_row_specs_travel_as_json(bench):
    shape = bench.SHAPES[("llama", False)]
    spec = bench.RowSpec(impl="xlscale", shape=shape, remat="full", packed=True, steps=3)
    assert bench.RowSpec.from_json(spec.to_json()) == spec
    assert spec.name == "xlscale/llama2_tiny/full/auto/packed/b8"


# Real texts: the XLA message on the H100, XLA's byte form, torch's CUDA error, libtpu.
XLA_OOM = (
    "jaxlib._jax.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate "
    "33.74GiB."
)
XLA_OOM_BYTES = (
    "XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 44849840128 bytes."
)
TORCH_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
    "capacity of 79.10 GiB of which 1.23 GiB is free. Including non-PyTorch memory, this process "
    "has 77.86 GiB memory in use. Of the allocated memory 75.12 GiB is allocated by PyTorch"
)
TPU_OOM = (
    "RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space hbm. "
    "Used 20.50G of 15.48G hbm. Exceeded hbm capacity by 5.02G."
)


def test_out_of_memory_messages_parse(harness):
    assert harness.oom_bytes(XLA_OOM) == pytest.approx(33.74 * 2**30)
    assert harness.oom_bytes(XLA_OOM_BYTES) == 44849840128
    assert harness.oom_bytes(TORCH_OOM) == pytest.approx(2 * 2**30)
    assert harness.oom_bytes(TPU_OOM) == pytest.approx(20.5 * 2**30)
    assert harness.oom_bytes("ValueError: shapes (3,) and (4,) differ") is None
    status, error, asked = harness.classify_failure(f"Traceback ...\n{XLA_OOM}\n", phase="run")
    assert (status, asked) == ("oom", pytest.approx(33.74 * 2**30)) and "33.74 GiB" in error
    assert harness.classify_failure("Traceback\nXlaRuntimeError: INTERNAL: ptxas", phase="compile")[
        :2
    ] == ("compile_error", "XlaRuntimeError: INTERNAL: ptxas")
    assert harness.classify_failure("KeyError: 'x'", phase="run")[0] == "error"


def test_budget_estimates_from_priors_then_measurements(harness):
    now = [0.0]
    budget = harness.Budget(100.0, clock=lambda: now[0])
    assert budget.estimate("xlscale/m", 60.0) == (60.0, "prior")
    now[0] = 30.0
    budget.record("xlscale/m", 25.0)
    budget.record("xlscale/m", 12.0)  # the slowest row of a model sets its estimate
    assert budget.estimate("xlscale/m", 60.0) == (25.0, "measured")
    assert budget.remaining() == 70.0
    assert harness.Budget(None).remaining() is None


def test_remat_candidates_drop_what_the_memory_model_says_cannot_fit(bench):
    shape = bench.SHAPES[("llama", True)]
    assert bench.remat_candidates(shape, bytes_limit=None) == ("none", "dots_saveable", "full")
    cost = {"none": 90e9, "dots_saveable": 60e9, "full": 30e9}
    fits = bench.remat_candidates(shape, bytes_limit=76e9, estimate=lambda s, r: cost[r])
    assert fits == ("dots_saveable", "full")
    # Nothing predicted to fit: the leanest policy is still tried, and the line says so.
    answer = {"kernel": "cudnn", "bytes": cost, "error": None}
    order = bench.REMAT_ORDER
    tight = bench.remat_choice("llama", shape, order=order, limit=20e9, answer=answer)
    assert tight.candidates == ("full",) and tight.dropped == ("none", "dots_saveable")
    assert ", nothing fits; trying full (est. full 27.94 GiB)" in tight.line()
    lean = bench.remat_choice("llama", shape, order=order, limit=40e9, answer=answer)
    assert lean.candidates == ("full",) and "nothing fits" not in lean.line()
    roomy = bench.remat_choice("llama", shape, order=order, limit=100e9, answer=answer)
    assert roomy.candidates == order and "drops nothing" in roomy.line()
    # No estimate for a policy asked for (or none at all): every policy is tried, saying why.
    partial = {"kernel": "cudnn", "bytes": {"none": 90e9}, "error": None}
    blind = bench.remat_choice("llama", shape, order=order, limit=20e9, answer=partial)
    assert blind.candidates == order
    assert "no estimate (no estimate for dots_saveable, full)" in blind.line()
    failed = {"error": "ValueError: boom"}
    assert (
        bench.remat_choice("t5", shape, order=order, limit=1.0, answer=failed).candidates == order
    )
    assert bench.halvings(64) == [64, 32, 16, 8] and bench.halvings(2) == [2, 1]


@pytest.mark.slow
def test_failed_rows_are_rows_and_the_next_row_runs(bench, tmp_path, monkeypatch, capsys):
    # The first policy dies in XLA's out-of-memory error (raised in the child), the second in
    # torch's (printed, exit 1, no result line); the third compiles and runs for real.
    monkeypatch.setenv(
        bench.harness.INJECT_ENV,
        "oom=xlscale/llama2_tiny/full/*;die-oom=xlscale/llama2_tiny/dots_saveable/*",
    )
    # The rows' processes on eight CPU devices, as the memory model's figure below was taken.
    monkeypatch.setenv("XLA_FLAGS", f"{os.environ.get('XLA_FLAGS', '')} {HOST_DEVICES_FLAG}")
    out = tmp_path / "rows.jsonl"
    argv = ["--models", "llama", "--packed", "no", "--steps", "1", "--no-hf", "--out", str(out)]
    rows = bench.main([*argv, "--remat", "full", "dots_saveable", "none"])
    assert [(r["remat"], r["status"]) for r in rows] == [
        ("full", "oom"),
        ("dots_saveable", "oom"),
        ("none", "ok"),
    ]
    assert rows[0]["oom_bytes"] == pytest.approx(33.74 * 2**30)
    assert rows[1]["oom_bytes"] == pytest.approx(2 * 2**30) and "exit code 1" in rows[1]["error"]
    ok = rows[2]
    assert ok["step_ms"] > 0 and math.isfinite(ok["loss"]) and ok["mfu"] is None
    assert ok["xla_bytes"] > 0 and ok["xla_memory"]["temp"] > 0
    # The memory model's estimate of the row's own step, beside XLA's (1.02x here).
    assert ok["est_bytes"] == pytest.approx(ok["xla_bytes"], rel=0.15)
    assert ok["est_kernel"] == "xla" and ok["est_error"] is None
    written = records(out)
    assert [r["record"] for r in written] == ["header", "row", "row", "row", "summary"]
    assert written[0]["memory"]["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.95"
    assert written[1:4] == rows
    printed = capsys.readouterr().out
    assert "est GiB" in printed
    assert "MFU = with-attention model FLOPs" in printed
    assert "XLA_PYTHON_CLIENT_PREALLOCATE=true" in printed
    assert "out of memory asking 33.74 GiB" in printed


@pytest.mark.slow
def test_a_failed_probe_ends_the_run_in_one_line(bench, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(bench.harness.INJECT_ENV, "oom=probe")
    out = tmp_path / "rows.jsonl"
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--no-hf", "--out", str(out)])
    assert exit_.value.code == 1
    assert "probe failed (oom): out of memory asking 33.74 GiB" in capsys.readouterr().out
    assert [r["record"] for r in records(out)] == ["header", "summary"]


@pytest.mark.slow
def test_a_small_budget_skips_rows_and_says_which(tmp_path):
    # The parent runs in its own process here, so it can also show that it never imported JAX
    # (on a GPU a backend in the parent would hold memory the rows need).
    out = tmp_path / "rows.jsonl"
    code = (
        f"import runpy, sys; sys.argv = ['x', '--budget-s', '12', '--no-hf', '--remat', 'none', "
        f"'--out', {str(out)!r}]; m = runpy.run_path({str(PATH)!r}); m['main'](sys.argv[1:]); "
        "print('parent imported', sorted({'jax', 'torch'} & set(sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    written = records(out)
    skipped = [r for r in written if r.get("status") == "skipped"]
    assert [r["name"] for r in skipped] == [
        LLAMA_NONE,
        "xlscale/llama2_tiny/none/auto/packed/b8",
        "xlscale/t5_tiny/none/auto/unpacked/b8",
        "xlscale/t5_tiny/none/auto/packed/b8",
    ]
    assert all("(prior)" in r["error"] and "s left" in r["error"] for r in skipped)
    assert list(written[-1]["skipped"]) == [r["name"] for r in skipped]
    assert "skipped 4 row(s) for the budget:" in done.stdout
    assert f"  {LLAMA_NONE}: needs ~20 s (prior)" in done.stdout
    assert "parent imported []" in done.stdout


def _parent(tmp_path, inject, *extra):
    env = {**os.environ, "XLSCALE_BENCH_INJECT": inject}
    argv = [sys.executable, str(PATH), "--models", "llama", "--remat", "none", "--no-hf"]
    return subprocess.Popen(
        [*argv, "--out", str(tmp_path / "rows.jsonl"), "--compile-cache", str(tmp_path), *extra],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def children_of(pid):
    """The live processes whose parent is `pid` (from /proc)."""
    found = []
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


@pytest.mark.slow
def test_rows_are_streamed_before_the_run_ends(tmp_path):
    # The first row fails fast; the second hangs; the parent is killed (SIGKILL, as a lease
    # ends) once the first row is on disk. The finished row is there, the run never wrote its
    # summary, and the hung row died with its parent.
    proc = _parent(tmp_path, "oom=*/unpacked/*;hang=*/packed/*")
    out = tmp_path / "rows.jsonl"
    deadline = time.monotonic() + 90
    hung = []
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if out.exists() and any(r["record"] == "row" for r in records(out)):
                hung = children_of(proc.pid)
                if hung:
                    break
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the parent, started here
        stdout, _ = proc.communicate()
    written = records(out)
    assert [(r["record"], r.get("status")) for r in written] == [("header", None), ("row", "oom")]
    assert len(hung) == 1
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and pathlib.Path(f"/proc/{hung[0]}").exists():
        state = pathlib.Path(f"/proc/{hung[0]}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state == "Z":
            break
        time.sleep(0.1)
    else:
        assert not pathlib.Path(f"/proc/{hung[0]}").exists(), "the hung row outlived its parent"
    assert "out of memory asking 33.74 GiB" in stdout  # the table row was printed as it came


@pytest.mark.slow
def test_a_hung_row_times_out_and_the_run_goes_on(tmp_path):
    logs = tmp_path / "logs"
    proc = _parent(
        tmp_path, "hang=*/unpacked/*;oom=*/packed/*", "--row-timeout-s", "12", "--logs", str(logs)
    )
    # 12 s: the row that fails at once starts a Python of its own, ~3-10 s on a loaded 2-core CI.
    stdout, stderr = proc.communicate(timeout=240)
    assert proc.returncode == 0, stderr[-2000:]
    rows = [r for r in records(tmp_path / "rows.jsonl") if r["record"] == "row"]
    assert [r["status"] for r in rows] == ["timeout", "oom"]
    assert rows[0]["error"].endswith("(killed) at row timeout") and 12 <= rows[0]["wall_s"] < 60
    assert "1 oom, 1 timeout" in stdout
    log = (logs / "xlscale__llama2_tiny__none__auto__packed__b8.log").read_text()
    assert "RESOURCE_EXHAUSTED: Out of memory" in log and "--- stderr" in log


BLOCKER = '''\
"""Test-only: TensorFlow, seqio and gin cannot be imported in this interpreter."""
import sys


class _Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {"tensorflow", "seqio", "gin"}:
            raise ImportError(f"{name} is blocked: the benchmark must run without it")
        return None


sys.meta_path.insert(0, _Blocked())
'''


@pytest.mark.slow
def test_runs_without_tensorflow_seqio_or_gin(tmp_path):
    # A sitecustomize on PYTHONPATH blocks the three in the parent and (the parent keeps our
    # PYTHONPATH for its children) in every child; one real T5 row runs through the child path,
    # in --quick, so the real probe answers with the memory model's estimates (the CPU has no
    # bytes_limit: nothing is dropped) and the row's own estimate is the probe's.
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(BLOCKER)
    env = {**os.environ, "PYTHONPATH": str(blocker)}
    blocked = subprocess.run(
        [sys.executable, "-c", "import seqio"], env=env, capture_output=True, text=True
    )
    assert blocked.returncode != 0 and "is blocked" in blocked.stderr
    out = tmp_path / "rows.jsonl"
    argv = ["--quick", "--models", "t5", "--remat", "none", "full", "--steps", "1", "--no-hf"]
    done = subprocess.run(
        [sys.executable, str(PATH), *argv, "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    (row,) = [r for r in records(out) if r["record"] == "row"]
    assert row["status"] == "ok", row.get("log_tail")
    assert row["model"] == "t5_tiny" and math.isfinite(row["loss"]) and row["tokens_per_s"] > 0
    assert row["est_bytes"] > 0 and row["est_error"] is None and row["remat"] == "none"
    header = records(out)[0]
    t5 = header["probe"]["estimates"]["t5"]
    assert t5["error"] is None and set(t5["bytes"]) == {"none", "full"}
    assert t5["bytes"]["none"] == row["est_bytes"]
    assert header["remat_plan"]["t5"]["candidates"] == ["none", "full"]
    assert "no bytes_limit, nothing dropped; trying none, full" in done.stdout


GIB = 2**30


def blind_choices(bench, shapes):
    """Each model's remat choice without a memory model: every policy, in order."""
    order = bench.REMAT_ORDER
    return {
        m: bench.remat_choice(m, s, order=order, limit=None, answer=None) for m, s in shapes.items()
    }


def row_name(bench, argv):
    """The name of the row a faked child was asked to run."""
    return bench.RowSpec.from_json(argv[-1]).name


@pytest.mark.parametrize("limit_gib", [80.0, None])
def test_quick_starts_where_the_memory_model_says_it_fits(
    bench, harness, tmp_path, monkeypatch, capsys, limit_gib
):
    # The whole --quick run with every child faked: the probe reports an 80 GiB GPU and puts
    # LLaMA's `none` at 153 GiB, so the plan starts at `dots_saveable` and says so; that row
    # then really runs out of memory and `full` serves. Without a bytes_limit (as on the CPU)
    # nothing is dropped: `none` is tried (and runs out of memory) first.
    estimates = {
        "llama": {
            "kernel": "cudnn",
            "bytes": {"none": 153 * GIB, "dots_saveable": 40 * GIB, "full": 37 * GIB},
            "error": None,
        },
        "t5": {
            "kernel": "xla",
            "bytes": {"none": 43 * GIB, "dots_saveable": 30 * GIB, "full": 9 * GIB},
            "error": None,
        },
    }
    sent = {}

    def fake_child(argv, *, env, cwd, timeout_s):
        if "--probe" in argv:
            sent.update(json.loads(argv[argv.index("--shapes") + 1]))
            result = {
                "status": "ok",
                "backend": "gpu",
                "device_kind": "NVIDIA H100 80GB HBM3",
                "device_count": 1,
                "bytes_limit": None if limit_gib is None else limit_gib * GIB,
                "jax": "0.10.2",
                "torch": None,
                "torch_cuda": False,
                "transformers": False,
                "estimates": estimates,
            }
        elif row_name(bench, argv).startswith(
            ("xlscale/llama2_1085m/none/", "xlscale/llama2_1085m/dots_saveable/")
        ):
            result = {"status": "oom", "error": "out of memory", "oom_bytes": 1.0}
        else:
            result = {"status": "ok", "error": None, "tokens_per_s": 1.0, "step_ms": 1.0}
        return harness.ChildRun(0, harness.ROW_MARK + json.dumps(result), "", 1.0, False)

    monkeypatch.setattr(harness, "run_child", fake_child)
    out = tmp_path / "rows.jsonl"
    rows = bench.main(["--quick", "--no-hf", "--out", str(out)])
    # The probe was sent both sets of shapes; it answers for its own backend's.
    assert sent["policies"] == list(bench.REMAT_ORDER)
    llama = bench.RowSpec.from_dict(sent["rows"]["accelerator"]["llama"])
    assert llama.shape == bench.SHAPES[("llama", True)] and llama.dtype == "bfloat16"
    assert dict(llama.shape.overrides)["scan_layers"] is True  # as the memory model assumes
    assert sent["rows"]["cpu"]["t5"]["shape"]["size"] == "t5_tiny"
    tried = ["none", "dots_saveable", "full"] if limit_gib is None else ["dots_saveable", "full"]
    assert [(r["name"], r["status"]) for r in rows] == [
        *[(f"xlscale/llama2_1085m/{p}/auto/unpacked/b8", "oom") for p in tried[:-1]],
        ("xlscale/llama2_1085m/full/auto/unpacked/b8", "ok"),
        ("xlscale/llama2_1085m/full/auto/packed/b8", "ok"),
        ("xlscale/t5_770m/none/auto/unpacked/b64", "ok"),
    ]
    header = records(out)[0]
    plan = header["remat_plan"]["llama"]
    assert plan["candidates"] == tried and plan["estimates"]["none"] == 153 * GIB
    assert plan["dropped"] == ([] if limit_gib is None else ["none"])
    assert header["remat_plan"]["t5"]["dropped"] == [] and header["probe"]["estimates"] == estimates
    printed = capsys.readouterr().out
    if limit_gib is None:
        assert (
            "memory model: llama2_1085m (cudnn attention): est. none 153.00 GiB, dots_saveable "
            "40.00 GiB, full 37.00 GiB; no bytes_limit, nothing dropped; trying none, "
            "dots_saveable, full"
        ) in printed
    else:
        assert (
            "memory model: llama2_1085m (cudnn attention): drops none (est. none 153.00 GiB > "
            "bytes_limit 80.00 GiB); trying dots_saveable, full (est. dots_saveable 40.00 GiB, "
            "full 37.00 GiB)"
        ) in printed
        assert "memory model: t5_770m (xla attention): drops nothing" in printed


def test_quick_plan_falls_back_on_out_of_memory(bench, harness, monkeypatch, capsys):
    # The plan itself, on the paper shapes, with every child faked (no process): LLaMA's `none`
    # runs out of memory, so `dots_saveable` serves the unpacked and the packed row; the T5 peer
    # holds only a quarter of its batch. Peers' ratios land on the xlscale rows of their model.
    def fake_child(argv, *, env, cwd, timeout_s):
        spec = bench.RowSpec.from_json(argv[-1])
        oom = spec.name.startswith(("xlscale/llama2_1085m/none/", "hf_eager/t5_770m/b64"))
        oom = oom or spec.name == "hf_eager/t5_770m/b32"
        if oom:
            result = {"status": "oom", "error": "out of memory", "oom_bytes": 1.0}
        else:
            speed = {"xlscale": 2000.0}.get(spec.impl, 1000.0)
            result = {"status": "ok", "error": None, "tokens_per_s": speed, "step_ms": 1.0}
        stdout = harness.ROW_MARK + json.dumps(result) + "\n"
        return harness.ChildRun(0, stdout, "", 1.0, False)

    monkeypatch.setattr(harness, "run_child", fake_child)
    planner = bench.Planner(
        accelerator=True,
        steps=5,
        warmup=1,
        dtype="bfloat16",
        memory=bench.MemorySettings(),
        peer_device_ok=True,
        compile_cache="/nonexistent",
    )
    session = harness.Session(
        budget=harness.Budget(360.0), out=harness.JsonLines(None), cwd=".", row_timeout_s=None
    )
    shapes = {m: bench.SHAPES[(m, True)] for m in ("llama", "t5")}
    bench.plan_quick(session, planner, shapes, blind_choices(bench, shapes))
    assert [(r["name"], r["status"]) for r in session.rows] == [
        ("xlscale/llama2_1085m/none/auto/unpacked/b8", "oom"),
        ("xlscale/llama2_1085m/dots_saveable/auto/unpacked/b8", "ok"),
        ("xlscale/llama2_1085m/dots_saveable/auto/packed/b8", "ok"),
        ("hf_compile/llama2_1085m/b8", "ok"),
        ("xlscale/t5_770m/none/auto/unpacked/b64", "ok"),
        ("hf_eager/t5_770m/b64", "oom"),
        ("hf_eager/t5_770m/b32", "oom"),
        ("hf_eager/t5_770m/b16", "ok"),
    ]
    assert session.ratios == {
        "xlscale/llama2_1085m/dots_saveable/auto/unpacked/b8": 2.0,
        "xlscale/llama2_1085m/dots_saveable/auto/packed/b8": 2.0,
        "xlscale/t5_770m/none/auto/unpacked/b64": 2.0,
    }
    printed = capsys.readouterr().out
    assert "vs HF: xlscale/t5_770m/none/auto/unpacked/b64 2.00x hf_eager" in printed
    assert "tokens/s, peer at batch 16)" in printed


def test_budget_learns_row_durations_and_skips_what_cannot_finish(bench, harness, monkeypatch):
    # Every (faked) row takes 100 s of a 250 s budget: the first LLaMA row runs on its prior
    # (60 s), the second on the measured 100 s; then 50 s are left, less than the LLaMA peer's
    # and T5's priors (90 s, 60 s): skipped, and the T5 search stops there. The T5 peer's prior
    # (40 s) still fits.
    now = [0.0]

    def slow_child(argv, *, env, cwd, timeout_s):
        now[0] += 100.0
        result = {"status": "ok", "error": None, "tokens_per_s": 1.0, "step_ms": 1.0}
        return harness.ChildRun(0, harness.ROW_MARK + json.dumps(result), "", 100.0, False)

    monkeypatch.setattr(harness, "run_child", slow_child)
    planner = bench.Planner(
        accelerator=True,
        steps=5,
        warmup=1,
        dtype="bfloat16",
        memory=bench.MemorySettings(),
        peer_device_ok=True,
        compile_cache="/nonexistent",
    )
    session = harness.Session(
        budget=harness.Budget(250.0, clock=lambda: now[0]),
        out=harness.JsonLines(None),
        cwd=".",
        row_timeout_s=None,
    )
    shapes = {m: bench.SHAPES[(m, True)] for m in ("llama", "t5")}
    bench.plan_quick(session, planner, shapes, blind_choices(bench, shapes))
    assert [(r["name"], r["status"]) for r in session.rows] == [
        ("xlscale/llama2_1085m/none/auto/unpacked/b8", "ok"),
        ("xlscale/llama2_1085m/none/auto/packed/b8", "ok"),
        ("hf_compile/llama2_1085m/b8", "skipped"),
        ("xlscale/t5_770m/none/auto/unpacked/b64", "skipped"),
        ("hf_eager/t5_770m/b64", "ok"),
    ]
    assert session.rows[2]["error"] == "needs ~90 s (prior), 50 s left"
    assert list(session.summary()["skipped"]) == [
        "hf_compile/llama2_1085m/b8",
        "xlscale/t5_770m/none/auto/unpacked/b64",
    ]
