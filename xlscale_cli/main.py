"""Entry point of the `xlscale` console script.

Each subcommand lives in its own module that exposes `add_arguments(parser)` and `run(args) -> int`
(`args.command` holds the subcommand's name, for modules that serve several).
Modules are imported lazily, so `xlscale sizes` never pays for TensorFlow and a subcommand whose
dependencies are heavy only loads them when it runs.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys

from xlscale_cli import terminal

# name -> (module, one-line help). A dict registry: adding a command is one line here.
COMMANDS: dict[str, tuple[str, str]] = {
    "sizes": ("xlscale_cli.sizes", "print the LLaMA2 size table of the CPT paper (Table 4)"),
    "data": (
        "xlscale_cli.data",
        "build the local corpora, or prepare tasks once into ArrayRecord shards",
    ),
    "tokenizer": (
        "xlscale_cli.tokenizer",
        "train or extend a SentencePiece vocabulary; grow a checkpoint to an extended one",
    ),
    "convert": ("xlscale_cli.convert", "convert LLaMA checkpoints: HF/Meta -> orbax, orbax -> HF"),
    "train": ("xlscale_cli.train", "run trainer.train (gin-configured)"),
    "eval": ("xlscale_cli.train", "run trainer.eval (gin-configured)"),
    "infer": ("xlscale_cli.train", "run trainer.infer (gin-configured)"),
    "fit": ("xlscale_cli.fit", "fit the papers' laws to a directory of runs"),
    "zeroshot": (
        "xlscale_cli.zeroshot",
        "score a checkpoint on zero-shot benchmarks through lm-evaluation-harness",
    ),
    "sweep": ("xlscale_cli.sweep", "plan, run, summarise and select among sweep manifests' runs"),
    "demo": (
        "xlscale_cli.demo",
        "run the main job: the CPT study (default) or, with --study mt, the translation study",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    """Builds the top-level parser; subcommand arguments are added only for the chosen command."""
    parser = argparse.ArgumentParser(prog="xlscale", description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=sorted(COMMANDS), help="subcommand")
    return parser


# Commands that are jobs: a SIGTERM before the job has taken over the signal (while Python imports
# JAX and TensorFlow, parses gin, plans) is a preemption, as it is once the job runs.
JOBS = frozenset({"train", "eval", "infer"})


def _preempted_before_start(prog: str) -> None:
    """Until the job installs its own handler (`trainer.preemption.SigtermFlag`, before it writes
    anything), SIGTERM ends the process at once with the preemption code and one line: nothing has
    been written, so starting the job again is all there is to do (a scheduler requeues on 75)."""
    from pipelines import native_logs  # light: the standard library only
    from rundir import exits

    line = f"{prog}: SIGTERM before the job started; nothing was written: start it again\n"

    def stop(signum, frame):
        del signum, frame
        # fd 2 may point at the third-party log (TensorFlow importing): the line goes to the
        # terminal all the same.
        os.write(native_logs.terminal_fd(), line.encode())
        os._exit(exits.PREEMPTED)

    signal.signal(signal.SIGTERM, stop)


# Exit status after the reader of stdout went away: the shell's for a SIGPIPE death (128 + 13).
BROKEN_PIPE_EXIT = 141


def main(argv: list[str] | None = None) -> int:
    """Runs `xlscale <command> ...`; stops quietly when stdout's reader has gone away.

    `xlscale sizes | head` closes the pipe early; Python then raises BrokenPipeError on the next
    write (and again when it flushes stdout at exit). As the Python docs recommend, the error is
    caught here and stdout pointed at /dev/null, so no traceback is printed, whatever the command.
    """
    try:
        status = _dispatch(argv)
        sys.stdout.flush()  # a closed pipe shows here rather than at interpreter exit
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return BROKEN_PIPE_EXIT
    if argv is None:  # the process's own command line: a failure does not wait on stuck threads
        from rundir import exits

        return exits.leave(status)
    return status


def _dispatch(argv: list[str] | None) -> int:
    """Dispatches `xlscale <command> ...` to the command's module; a known refusal ends as one
    message on stderr and its exit code (`rundir.exits`; the traceback with `--verbose`)."""
    from rundir import exits

    argv, verbose = exits.pop_verbose(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: xlscale <command> [options] [{exits.VERBOSE_FLAG}]\n\ncommands:")
        for name, (_, help_text) in sorted(COMMANDS.items()):
            print(f"  {name:<10} {help_text}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(
            f"xlscale: unknown command {name!r}; choose one of {', '.join(sorted(COMMANDS))}",
            file=sys.stderr,
        )
        return 2
    if name in JOBS:
        _preempted_before_start(f"xlscale {name}")
    terminal.setup()  # before a command imports TensorFlow: third-party lines off the terminal
    module = importlib.import_module(COMMANDS[name][0])
    parser = argparse.ArgumentParser(prog=f"xlscale {name}", description=COMMANDS[name][1])
    module.add_arguments(parser)
    args = parser.parse_args(rest)
    args.command = name
    try:
        return int(module.run(args) or 0)
    except Exception as e:
        code = exits.present(e, prog=f"xlscale {name}", verbose=verbose, argv=rest)
        if code is None:
            raise
        return code


if __name__ == "__main__":
    sys.exit(main())
