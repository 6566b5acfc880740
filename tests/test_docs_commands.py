"""Every shell block of README.md and docs/abci.md that names a script of the project runs as
written, on a fresh copy of the checkout, in its dry-run form: DRY_RUN=1 in the environment,
no `bash` put in front, the block's lines in one shell that stops at the first failure.

What this machine lacks is stood in for (tests/site_standin.py): qsub, sbatch and their query
commands run the job script as the scheduler would; an ABCI 3.0 node's lscpu and nvidia-smi;
module and singularity. The job scripts themselves, submit.sh and the set-up scripts are the
real ones, so a script that is not executable, a flag they refuse, a walltime in a form they
do not take or a default batch that does not divide by the ranks fails here."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import LAUNCH_VARS, REPO

DOCUMENTED = ("README.md", "docs/abci.md")
STANDINS = ("qsub", "sbatch", "qstat", "squeue", "scontrol", "module", "singularity", "lscpu", "nvidia-smi")


def shell_blocks(page: str) -> list[str]:
    text = (REPO / page).read_text()
    return [b for b in re.findall(r"```bash\n(.*?)```", text, re.S) if re.search(r"\bscripts/\S", b)]


BLOCKS = [(page, i, block) for page in DOCUMENTED for i, block in enumerate(shell_blocks(page))]


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """The working tree as git will hold it: each file with its mode in git's index (a script git
    holds as 100644 is not executable here either), and the image the build would have made."""
    root = tmp_path_factory.mktemp("clone") / "ddp_abci"
    listed = subprocess.run(["git", "ls-files", "-s"], cwd=REPO, stdout=subprocess.PIPE, text=True, check=True)
    for line in listed.stdout.splitlines():
        mode, _, _, path = line.split(maxsplit=3)
        if (REPO / path).is_file():
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(REPO / path, root / path)
            (root / path).chmod(0o755 if mode == "100755" else 0o644)
    (root / "ddp_abci.sif").write_bytes(b"")
    return root


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> dict[str, str]:
    bin_dir = tmp_path_factory.mktemp("site") / "bin"
    bin_dir.mkdir()
    standin = bin_dir / "site_standin.py"
    standin.write_text(f"#!{sys.executable}\n" + (REPO / "tests" / "site_standin.py").read_text())
    standin.chmod(0o755)
    for name in STANDINS:
        (bin_dir / name).symlink_to(standin)
    home = bin_dir.parent / "home"
    (home / "local").mkdir(parents=True)
    return {"PATH": f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}", "HOME": str(home),
            "PBS_LOCALDIR": str(home / "local"), "TMPDIR": str(home / "local")}


def user_env() -> dict[str, str]:
    """A login shell's environment: none of a launcher's variables, nor Open MPI's root
    permission (a command that needs it must say so itself)."""
    return {k: v for k, v in os.environ.items() if k not in LAUNCH_VARS and not k.startswith(("OMPI_", "PMIX_"))}


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if "__pycache__" not in p.parts}


def test_the_documented_pages_have_commands_to_run():
    assert {page for page, _, _ in BLOCKS} == set(DOCUMENTED) and len(BLOCKS) >= 6


@pytest.mark.parametrize("page, index, block", BLOCKS, ids=[f"{p}-{i}" for p, i, _ in BLOCKS])
def test_the_documented_commands_run_as_written(checkout, site, page, index, block):
    before = files_under(checkout)
    proc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block], cwd=checkout, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=120,
                          env={**user_env(), "DRY_RUN": "1", "PBS_O_WORKDIR": str(checkout), **site})
    assert proc.returncode == 0, f"{page}, block {index}:\n{block}\n---\n{proc.stdout}"
    assert "error:" not in proc.stdout, proc.stdout  # a refusal is one error: line, whatever its status
    assert files_under(checkout) == before, "a dry run wrote into the checkout"
    for job in re.findall(r"(?:qsub|sbatch) [^\n]*?(scripts/\S+)", block):
        assert f"runs {job}" in proc.stdout and "dry run: " in proc.stdout, proc.stdout
    if "TRAIN_SCRIPT=" in block and "scripts/submit.sh" in block:  # the script's own parser ran on its flags
        assert "its flags check out for" in proc.stdout, proc.stdout
