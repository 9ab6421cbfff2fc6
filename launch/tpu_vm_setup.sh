#!/usr/bin/env bash
# Installs xlscale on every worker of a Cloud TPU VM (a single host or a whole pod slice).
#
#   launch/tpu_vm_setup.sh [--dry-run] TPU_NAME ZONE [PROJECT]
#
# Copies this checkout (tracked and untracked-but-not-ignored files) to ~/xlscale on all workers,
# creates ~/xlscale/.venv there and installs the repository with `jax[tpu]==0.10.2` (libtpu from
# PyPI). Afterwards `xlscale sweep run M --launcher tpu_vm --tpu TPU_NAME --zone ZONE` starts
# runs there. Re-running updates the code and is otherwise a no-op for pip.
# --dry-run prints the gcloud commands instead of running them.
set -euo pipefail

DRY_RUN=0
if [[ "${1:-}" == "--dry-run" ]]; then
  DRY_RUN=1
  shift
fi
if [[ $# -lt 2 ]]; then
  echo "usage: $0 [--dry-run] TPU_NAME ZONE [PROJECT]" >&2
  exit 2
fi
TPU_NAME="$1"
ZONE="$2"
PROJECT="${3:-}"
JAX_VERSION="0.10.2"
REMOTE_DIR="xlscale"
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ARCHIVE="${TMPDIR:-/tmp}/xlscale-src.tar.gz"
REMOTE_ARCHIVE="xlscale-src.tar.gz"  # in the remote home directory

GCLOUD=(gcloud compute tpus tpu-vm)
TARGET=(--zone "$ZONE" --worker=all)
if [[ -n "$PROJECT" ]]; then
  TARGET+=(--project "$PROJECT")
fi

# Shell-quotes one word for display (single quotes, like Python's shlex.quote).
quote() {
  if [[ "$1" =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then
    printf '%s' "$1"
  else
    printf "'%s'" "${1//\'/\'\"\'\"\'}"
  fi
}

run() {
  if [[ "$DRY_RUN" == 1 ]]; then
    local words=()
    for word in "$@"; do
      words+=("$(quote "$word")")
    done
    echo "${words[*]}"
  else
    "$@"
  fi
}

# 1. Pack the working tree (without .venv, outputs or git metadata).
if [[ "$DRY_RUN" == 1 ]]; then
  echo "# pack $REPO_ROOT into $ARCHIVE"
else
  (cd "$REPO_ROOT" && git ls-files -co --exclude-standard -z | tar --null -T - -czf "$ARCHIVE")
fi

# 2. Copy it to every worker.
run "${GCLOUD[@]}" scp "$ARCHIVE" "$TPU_NAME:~/$REMOTE_ARCHIVE" "${TARGET[@]}"

# 3. Unpack, create the virtual environment and install, on all workers at once.
STEPS=(
  "mkdir -p ~/$REMOTE_DIR"
  "tar -xzf ~/$REMOTE_ARCHIVE -C ~/$REMOTE_DIR"
  "cd ~/$REMOTE_DIR"
  "(test -x .venv/bin/python || python3 -m venv .venv)"
  ".venv/bin/python -m pip install --upgrade pip setuptools wheel"
  ".venv/bin/python -m pip install -e . 'jax[tpu]==$JAX_VERSION'"
  ".venv/bin/python -c 'import jax; print(jax.process_index(), jax.device_count(), jax.devices()[0].platform)'"
)
REMOTE_SCRIPT="$(printf '%s && ' "${STEPS[@]}")"
REMOTE_SCRIPT="${REMOTE_SCRIPT% && }"
run "${GCLOUD[@]}" ssh "$TPU_NAME" "${TARGET[@]}" --command "$REMOTE_SCRIPT"
