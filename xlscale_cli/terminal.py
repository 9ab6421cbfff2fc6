"""What the `xlscale` commands print on the terminal: the project's own lines, and where the
third-party ones go instead.

`setup()` runs first in every command (`xlscale_cli.main`):

- native start-up lines of TensorFlow (absl's pre-InitializeLog warning, oneDNN, cudart_stub,
  cuInit) go to the third-party log: the first `import tensorflow` runs with fd 2 redirected
  (`pipelines.native_logs`), and tf_text's SentencePiece line is kept off where the tokenizer is
  built (`pipelines.sentencepiece_vocabulary`);
- Python logging: the project's records (loggers named after its packages) reach the terminal in
  the trainer's format; other libraries' records (absl and orbax, TensorFlow, JAX, ...) reach it
  only at ERROR and above, and otherwise go to the third-party log. A third-party error that ends
  a command still surfaces as the exception it raises, presented by `rundir.exits`.

The third-party log is `$XLSCALE_THIRD_PARTY_LOG` (appended to; `/dev/stderr` shows everything as
before), else nowhere. A run's worker process (`launch.launchers`) sends all of it to the run's
`train.log` instead.

`LINE_FORMATS` are the shapes of the project's terminal lines, in one place, for the tests that
hold a command's terminal to them.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
import re
import sys
from pathlib import Path

from pipelines import native_logs

# The log line format of the project's loggers (the trainer's progress lines included).
LOG_FORMAT = "%(asctime)s %(levelname)s %(message)s"
# The project's terminal lines, by who prints them.
LINE_FORMATS: dict[str, re.Pattern[str]] = {
    "log record (LOG_FORMAT)": re.compile(
        r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) \S"
    ),
    "demo stage (studies)": re.compile(r"^\[demo(-mt)?\] +\S"),
    "sweep progress (launch.status)": re.compile(r"^\[sweep \d+/\d+ done[^\]]*\] +\S"),
    "zero-shot progress (evals)": re.compile(r"^\[zeroshot\] \S"),
    "refusal (rundir.exits)": re.compile(r"^xlscale [a-z]+: \S"),
}
# The distribution whose packages count as the project's (its `top_level.txt`).
DISTRIBUTION = "xlscale"


def foreign_lines(text: str) -> list[str]:
    """The lines of `text` that match none of `LINE_FORMATS` (blank lines aside)."""
    return [
        line
        for line in text.splitlines()
        if line.strip() and not any(p.match(line) for p in LINE_FORMATS.values())
    ]


@functools.cache
def project_packages() -> frozenset[str]:
    """The project's top-level packages: the installed distribution's `top_level.txt`, else (a
    checkout run without installing) the packages beside `xlscale_cli`."""
    try:
        text = importlib.metadata.distribution(DISTRIBUTION).read_text("top_level.txt")
    except importlib.metadata.PackageNotFoundError:
        text = None
    if text:
        return frozenset(text.split())
    root = Path(__file__).resolve().parent.parent
    return frozenset(p.parent.name for p in root.glob("*/__init__.py"))


def is_project_record(record: logging.LogRecord) -> bool:
    """Whether a log record comes from one of the project's loggers (named after its modules)."""
    return record.name.split(".", 1)[0] in project_packages()


class _Stderr(logging.StreamHandler):
    """A handler that writes to whatever `sys.stderr` is when a record comes (as logging's
    last-resort handler does), so that a replaced `sys.stderr` (a test's capture) is followed."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:
        pass


class _Terminal(logging.Filter):
    """The project's records at any level; other libraries' from ERROR up."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR or is_project_record(record)


class _ThirdParty(logging.Filter):
    """What `_Terminal` keeps off the terminal."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not _Terminal().filter(record)


def setup(third_party_log: str | None = None) -> None:
    """Keeps third-party lines off the terminal (see the module docstring); call it before
    anything imports TensorFlow. Installs one terminal handler and, where a third-party log is
    named (`third_party_log`, else `$XLSCALE_THIRD_PARTY_LOG`), one file handler on the root
    logger, once."""
    native_logs.quiet_tensorflow_import()
    root = logging.getLogger()
    if any(isinstance(f, _Terminal) for h in root.handlers for f in h.filters):
        return
    terminal = _Stderr()
    terminal.setFormatter(logging.Formatter(LOG_FORMAT))
    terminal.addFilter(_Terminal())
    root.addHandler(terminal)
    path = third_party_log or native_logs.third_party_log()
    if path:
        elsewhere = logging.FileHandler(path, delay=True)
        elsewhere.setFormatter(logging.Formatter(f"{LOG_FORMAT} [%(name)s]"))
        elsewhere.addFilter(_ThirdParty())
        root.addHandler(elsewhere)
