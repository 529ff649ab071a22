#!/usr/bin/env bash
# verifiers 0.4 beside requirements.txt: `.ci/verifiers-overlay.sh BASE_VENV OVERLAY` makes the virtual environment
# OVERLAY whose site-packages adds BASE_VENV's after its own (a .pth running site.addsitedir, so the base's editable
# install and .pth files work too), then installs requirements-verifiers.txt into it: verifiers 0.4, mcp 2 and what
# they need that the base lacks or pins otherwise shadow the base's copies; everything else (paddle, ...) comes
# from the base, which is left unchanged (pip does not uninstall outside the environment it installs into).
set -euo pipefail
usage="usage: .ci/verifiers-overlay.sh BASE_VENV OVERLAY"
base=$(cd "${1:?$usage}" && pwd)
overlay=$(realpath -m "${2:?$usage}")
cd "$(dirname "$0")/.."
purelib='import sysconfig; print(sysconfig.get_paths()["purelib"])'
"$base/bin/python" -m venv "$overlay"
echo "import site; site.addsitedir('$("$base/bin/python" -c "$purelib")')" \
    > "$("$overlay/bin/python" -c "$purelib")/zz-base-venv.pth"
"$overlay/bin/python" -m pip install -q -r requirements-verifiers.txt
"$overlay/bin/python" -c 'import numpy, verifiers; print("verifiers", verifiers.__version__, "over", numpy.__file__)'
