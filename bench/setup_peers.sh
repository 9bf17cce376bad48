#!/usr/bin/env bash
# Create (idempotently) the virtualenvs holding the peer task queues that the
# benchmark compares dtq with. Run from anywhere; paths are relative to the repo root.
#
#   build/bench/peers-venv      dramatiq, taskiq(+taskiq-redis), streaq, celery, rq  (redis-py 8)
#   build/bench/peers-venv-arq  arq, saq                                             (redis-py 5)
#
# Two venvs because arq pins redis-py<6 (and saq<8) while taskiq-redis needs >=8.
# bench/peers/run_peer.py re-executes itself with the right one.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"

make_venv() {  # make_venv <venv dir> <requirements file>
  local venv="$1" req="$2" stamp
  stamp="$venv/.requirements.sha256"
  if [[ -x "$venv/bin/python" && -f "$stamp" ]] && sha256sum --status -c "$stamp" 2>/dev/null; then
    echo "up to date: $venv"
    return
  fi
  echo "creating: $venv"
  rm -rf "$venv"
  "$PYTHON" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  "$venv/bin/python" -m pip install --quiet -r "$req"
  "$venv/bin/python" -m pip check
  sha256sum "$req" > "$stamp"
}

mkdir -p "$ROOT/build/bench"
make_venv "$ROOT/build/bench/peers-venv" "$ROOT/bench/peers-requirements.txt"
make_venv "$ROOT/build/bench/peers-venv-arq" "$ROOT/bench/peers-arq-requirements.txt"
echo "peers ready: $ROOT/build/bench/peers-venv/bin/python bench/peers/run_peer.py --help"
