#!/usr/bin/env bash
# Runs the official-client tests (openai, anthropic, ollama) against a live `spindle serve` on
# the embedded demo model.
# Usage: bash tests/python/run.sh [path/to/spindle]   (default: target/release/spindle)
# Installs openai, anthropic, ollama, pydantic, langchain-openai and pytest into a venv under
# target/pyenv (or with pip --user when venv is unavailable). All traffic goes to 127.0.0.1.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bin="${1:-$root/target/release/spindle}"
case "$bin" in /*) ;; *) bin="$PWD/$bin" ;; esac
if [[ ! -x "$bin" ]]; then
    echo "run.sh: no spindle binary at $bin (build it with: cargo build --release -p spindle-cli)" >&2
    exit 2
fi

venv="$root/target/pyenv"
if [[ -x "$venv/bin/python" ]] || python3 -m venv "$venv" >/dev/null 2>&1; then
    py="$venv/bin/python"
    "$py" -m pip install --quiet --disable-pip-version-check openai anthropic ollama pytest pydantic langchain-openai
else
    py="python3"
    "$py" -m pip install --quiet --disable-pip-version-check --user openai anthropic ollama pytest pydantic langchain-openai
fi

cd "$root"
exec "$py" -m pytest -q -p no:cacheprovider tests/python --spindle-bin "$bin"
