# shellcheck shell=bash
# Sourced by both build scripts: what the recipes read from the checkout's .container/ (made here,
# ignored by git), so that the Dockerfile and the definition file take the same knobs:
#   EXTRA_REQUIREMENTS  a requirements file of your packages (datasets, tokenizers, tensorboard, ...)
#   EXTRA_PACKAGES      more of them, space-separated ("datasets==5.2.0 tokenizers")
#   TORCH_INDEX         another build of the same torch (e.g. https://download.pytorch.org/whl/cu128
#                       for an older driver); empty: PyPI's
# Your packages are installed after the pinned stack, every package of it a constraint: one that
# needs another torch or numpy is refused at build time, naming both (ddp_abci/cluster/extras.py).
stage_build() {
    local lines=""
    if [ -n "${EXTRA_REQUIREMENTS:-}" ]; then
        [ -r "$EXTRA_REQUIREMENTS" ] || { echo "error: EXTRA_REQUIREMENTS=$EXTRA_REQUIREMENTS cannot be read" >&2
            exit 2; }
        lines=$(cat "$EXTRA_REQUIREMENTS")
    fi
    local package
    for package in ${EXTRA_PACKAGES:-}; do lines+=$'\n'$package; done
    if [ "${DRY_RUN:-}" = 1 ]; then
        echo "dry run: .container/extra-requirements.txt: $(tr '\n' ' ' <<<"${lines:-(none)}")"
        echo "dry run: .container/build.env: TORCH_INDEX=${TORCH_INDEX:-}"
        return 0
    fi
    mkdir -p .container
    printf '%s\n' "$lines" >.container/extra-requirements.txt
    printf 'TORCH_INDEX=%q\n' "${TORCH_INDEX:-}" >.container/build.env
}
