"""Which of the submitting shell's variables reach the ranks (ddp_abci/cluster/forwarding.py), and
how a secret's value is kept out of files others read, logs and command lines. A real two-host
job under PBS checks the same end to end (test_pbs.py)."""
import os
import stat

import pytest

from ddp_abci.cluster import forwarding
from helpers import REPO, env, run


def test_hf_and_wandb_variables_go_by_default_and_forward_env_adds_names_and_patterns():
    shell = {"HF_HOME": "/h", "WANDB_MODE": "offline", "MY_CACHE": "/c", "OTHER": "x", "PATH": "/bin",
             "NCCL_DEBUG": "1"}
    plain, secret = forwarding.carried(shell, "MY_* TOKENIZERS_PARALLELISM")
    assert plain == {"HF_HOME": "/h", "WANDB_MODE": "offline", "MY_CACHE": "/c", "NCCL_DEBUG": "1"} and not secret
    assert "OTHER" not in plain and "PATH" not in plain  # the login shell's PATH is not the node's


@pytest.mark.parametrize("name", ["HF_TOKEN", "WANDB_API_KEY", "MY_SECRET", "DB_PASSWORD", "hf_token"])
def test_a_name_that_says_token_key_secret_or_password_is_a_secret(name):
    plain, secret = forwarding.carried({name: "v"}, "*")
    assert forwarding.looks_secret(name) and secret == {name: "v"} and not plain


def test_mpirun_gets_each_forwarded_variables_name_never_its_value():
    flags = forwarding.mpirun_flags({"HF_TOKEN": "s3cret", "OMP_NUM_THREADS": "4", "X": "1"}, "", also=("X",))
    assert flags == ["-x", "HF_TOKEN", "-x", "OMP_NUM_THREADS", "-x", "X"] and "s3cret" not in " ".join(flags)


def test_mpi_args_that_put_a_secrets_value_on_the_command_line_are_named():
    assert forwarding.secret_in_mpi_args("--mca btl tcp -x HF_TOKEN=abc") == "HF_TOKEN"
    assert forwarding.secret_in_mpi_args("-x HF_TOKEN -x NCCL_DEBUG=INFO") is None  # a name alone is fine


def test_the_secrets_file_is_created_readable_by_its_owner_alone_in_a_folder_only_they_enter(tmp_path):
    path = forwarding.write_secrets({"HF_TOKEN": "a b'c"}, tmp_path / "secrets", "job.x")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    sourced = run(["bash", "-c", f'set -a; . {path}; printf %s "$HF_TOKEN"'])
    assert sourced.stdout == "a b'c"
    (tmp_path / "open").mkdir(mode=0o755)
    os.chmod(tmp_path / "open", 0o755)
    with pytest.raises(ValueError, match="can be entered by other users"):
        forwarding.write_secrets({"HF_TOKEN": "x"}, tmp_path / "open", "job.y")


def test_submit_refuses_mpi_args_with_a_secrets_value_before_writing_anything(tmp_path):
    proc = run([str(REPO / "scripts" / "submit.sh"), "slurm"], env=env(MPI_ARGS="-x HF_TOKEN=abc", DRY_RUN="1",
                                                                       SUBMIT_DIR=str(tmp_path / "s")))
    assert proc.returncode == 2 and "MPI_ARGS gives HF_TOKEN's value on mpirun's command line" in proc.stdout
    assert "abc" not in proc.stdout.replace("HF_TOKEN=abc", "") and not (tmp_path / "s").exists()


def test_a_dry_run_names_the_secrets_it_would_carry_and_shows_no_value(tmp_path):
    proc = run([str(REPO / "scripts" / "submit.sh"), "slurm"], env=env(HF_TOKEN="tok-123", HF_HOME="/hf",
                                                                       DRY_RUN="1", SUBMIT_DIR=str(tmp_path / "s")))
    assert proc.returncode == 0, proc.stdout
    assert "HF_HOME=/hf" in proc.stdout and "HF_TOKEN" in proc.stdout and "tok-123" not in proc.stdout
