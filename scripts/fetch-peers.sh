#!/usr/bin/env bash
# Installs the peers' Python (scripts/peers/*/peer.toml use {python}) into the git-ignored
# target/peers/venv: torch (CPU kernels; the PyPI wheel also carries CUDA libraries, ~3 GB) and
# numpy. Not run by CI (too large); CI tests the peer protocol with a small test peer.
# Then: harness exp speed_bars --peer torch_sdpa
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/target/peers/venv"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check torch numpy
"$venv/bin/python" -c "import torch; print('torch', torch.__version__, 'in', '$venv')"
