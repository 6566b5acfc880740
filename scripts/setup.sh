#!/usr/bin/env bash
# Set up .venv with ddp_abci and its extras. Idempotent: a second run only checks.
#   TORCH_SPEC  torch requirement to install first (default torch==2.13.0, the CPU build
#               this project is tested with; on GPU machines pass the CUDA build you need)
#   EXTRAS      extras of ddp_abci to install (default mpi,test)
#   DRY_RUN     1: print the commands instead of running them
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
EXTRAS=${EXTRAS:-mpi,test}
PYTHON=${PYTHON:-python3}
if [ "${DRY_RUN:-}" = 1 ]; then
    echo "dry run: $PYTHON -m venv .venv; .venv/bin/python -m pip install $TORCH_SPEC; .venv/bin/python -m pip install -e .[$EXTRAS]; (with test) .venv/bin/python -m pip install --no-deps litdata==0.2.76 mosaicml-streaming==0.10.0; .venv/bin/python -m compileall -q ddp_abci"
    exit 0
fi

[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# torch first and pinned: an unpinned torch pulled in by a dependency is a multi-GB CUDA build.
.venv/bin/python -m pip install -q "$TORCH_SPEC"
.venv/bin/python -m pip install -q -e ".[${EXTRAS}]"
# litdata and MosaicML streaming for the tests, without their declared requirements: both ask for
# torchvision, whose PyPI wheel fails to load beside the CPU torch ("operator torchvision::nms does
# not exist"), and streaming 0.10 for transformers 4, which wants a huggingface-hub older than
# Accelerate's; reading local shards needs neither (what it needs is in the test extra).
if [[ ",$EXTRAS," == *,test,* ]]; then
    .venv/bin/python -m pip install -q --no-deps litdata==0.2.76 mosaicml-streaming==0.10.0
fi
# The package's bytecode, written once: where PYTHONDONTWRITEBYTECODE is set (this project's test
# machines set it) every process compiles the package again, 60 to 80 ms a rank (measured with
# python -X importtime); pip's wheels come compiled, an editable install does not.
.venv/bin/python -m compileall -q ddp_abci
echo "setup: $(.venv/bin/python -c 'import torch, ddp_abci; print("ddp_abci", ddp_abci.__version__, "torch", torch.__version__)')"
