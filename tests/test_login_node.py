"""What runs on a login node (submit.sh, the status command, the job scripts' Python half) runs
there without torch: each command is run here in a Python where importing torch or numpy fails."""
import json
import subprocess
import sys

import pytest

from helpers import REPO, env

BLOCKED = """import runpy, sys
class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "numpy"):
            raise ImportError(f"{name} is not on a login node")
sys.meta_path.insert(0, Blocked())
module, sys.argv = sys.argv[1], sys.argv[1:]
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


def without_torch(module: str, *args: str, **settings: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCKED, module, *args], cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=60, env=env(**settings))


def test_the_blocker_blocks():
    proc = without_torch("ddp_abci.train", "--epochs", "1")
    assert proc.returncode != 0 and "torch is not on a login node" in proc.stdout


def test_submit_checks_and_prints_a_chain_without_torch(tmp_path):
    proc = without_torch("ddp_abci.jobs", "submit", "abci3", "-g", "g", "-n", "2", "-c", "3", "--", "--epochs", "5",
                         DRY_RUN="1", CKPT_DIR=str(tmp_path / "ck"), SUBMIT_DIR=str(tmp_path / "s"))
    assert proc.returncode == 0 and proc.stdout.count("qsub -P g") == 3, proc.stdout
    refused = without_torch("ddp_abci.jobs", "submit", "abci3", "-g", "g", "--", "--bs", "50", DRY_RUN="1")
    assert refused.returncode == 2 and "does not divide" in refused.stdout, refused.stdout


def test_the_status_command_runs_without_torch(tmp_path):
    (tmp_path / "chain.json").write_text(json.dumps({"site": "slurm", "jobs": [], "node_hours": "1"}))
    proc = without_torch("ddp_abci.status", str(tmp_path), "--json")
    assert proc.returncode == 0 and json.loads(proc.stdout)["site"] == "slurm", proc.stdout


@pytest.mark.parametrize("site", ["abci3", "abci2", "slurm"])
def test_the_job_scripts_python_half_decides_a_job_without_torch(tmp_path, site):
    nodes = tmp_path / "nodes"
    nodes.write_text("h1\nh2\n")
    proc = without_torch("ddp_abci.jobs", "prepare", "--site", site, "--hostfile", str(tmp_path / "hosts"), "--",
                         "--epochs", "1", NODEFILE=str(nodes), CONTAINER="none", NPROC_PER_NODE="2", DRY_RUN="1")
    assert proc.returncode == 0 and "NP=4" in proc.stdout and "TRAIN=(-m ddp_abci.train --bs 256" in proc.stdout, \
        proc.stdout
