#!/usr/bin/env bash
# Build (or reuse) the venv that runs the real sglang 0.5.23 beside cpkv on a CPU machine:
# ../shared/oracle/setup_oracle_venv.sh, then cpkv and its test tools into it, then a check
# that cpkv loads sglang there. The output goes to .oracle-setup.log; one line says the result.
#
#   bash scripts/oracle_venv.sh [VENV]   # default .oracle-venv
#
# Exit 0: ready; 3: the oracle set-up is not here or could not be built; 1: it built but cpkv
# cannot load sglang from it.
#
# sglang is installed without its dependencies (a short list of what its scheduler imports
# is added), so pip's resolver reports sglang's other requirements as conflicts in the log:
# they are expected; the check at the end is what says whether the venv works.
# cpkv goes in editable and uncompiled (CPKV_PURE_PYTHON=1): the tests run its sources, and a
# compiled build of the tree, if any, stays as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.oracle-venv}
SETUP=../shared/oracle/setup_oracle_venv.sh
LOG=.oracle-setup.log
if [ ! -f "$SETUP" ]; then
  echo "oracle venv: $SETUP not found (the oracle lives beside this checkout in ../shared)" >&2
  exit 3
fi
if ! "$VENV/bin/python" -c "from cpkv.admission.sglang.world import load_sglang; load_sglang()" 2>/dev/null; then
  { bash "$SETUP" "$VENV" \
      && CPKV_PURE_PYTHON=1 "$VENV/bin/pip" install --no-deps -e . \
      && "$VENV/bin/pip" install pytest hypothesis typer tabulate omegaconf; } > "$LOG" 2>&1 || {
    echo "oracle venv: the set-up failed; the end of $LOG:" >&2
    tail -5 "$LOG" >&2
    exit 3
  }
else
  CPKV_PURE_PYTHON=1 "$VENV/bin/pip" install -q --no-deps -e . > "$LOG" 2>&1
fi
if ! "$VENV/bin/python" -c "from cpkv.admission.sglang.world import load_sglang; load_sglang()" >> "$LOG" 2>&1; then
  echo "oracle venv: built, but cpkv cannot load sglang from it (see $LOG)" >&2
  exit 1
fi
conflicts=$(grep -c "requires .*, which is not installed\|but you have .* which is incompatible" "$LOG" || true)
version=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("sglang"))')
note=""
if [ "$conflicts" -gt 0 ]; then
  note="; the $conflicts pip resolver complaints in $LOG about sglang's own dependencies are expected (it is installed without them)"
fi
echo "oracle venv ready: $VENV, sglang $version loads$note"
