"""--grad-compression: torch's DDP communication hooks (fp16, bf16, PowerSGD) in place of the plain
all-reduce, as Accelerate's comm_hook registers them, on real ranks; PowerSGD's state (each
rank's error feedback, its warm-started factors, its generator) carried by the checkpoint."""
import pytest

from helpers import env, load, one_error, run_mpi, same_tensors, train_here

pytestmark = pytest.mark.usefixtures("mpirun")

# 40 steps an epoch; a model of 0.6 M parameters, two gradient buckets (DDP's first is 1 MiB):
# PowerSGD's collectives of one bucket must not cross the next one's.
SMALL = ["--num-items", "2000", "--seed", "3", "--bs", "50", "--comm", "gloo",
         "--dim-in", "1000", "--dim-hidden", "300"]
POWERSGD = ["--grad-compression", "powersgd", "--powersgd-warmup-steps", "5", "--powersgd-rank", "2"]


@pytest.mark.untimed
@pytest.mark.parametrize("kind", ["fp16", "powersgd"])
def test_a_compression_hook_replaces_the_all_reduce_and_trains(kind):
    proc = run_mpi(2, *SMALL, "--epochs", "1", "--grad-compression", kind, "--powersgd-warmup-steps", "5")
    assert proc.returncode == 0 and f"gradients via gloo, {kind} compressed" in proc.stdout, proc.stdout
    assert "done: 40 steps" in proc.stdout and "replicas agree" in proc.stdout


@pytest.mark.untimed
def test_powersgd_stopped_and_resumed_ends_bit_for_bit_where_the_uninterrupted_run_ends(tmp_path):
    # OMP_NUM_THREADS fixed from the start, as the job scripts set it: the first step of a new
    # process has DDP's one bucket where the uninterrupted run has two, and with unbound ranks
    # whose threads are set after start-up that step rounds differently (3.7e-9 at step 28,
    # docs/reliability.md); bound ranks or OMP_NUM_THREADS=1 give 0.
    one_thread = env(OMP_NUM_THREADS="1")
    run_mpi(2, *SMALL, *POWERSGD, "--epochs", "2", "--ckpt-dir", str(tmp_path / "whole"), env=one_thread)
    first = run_mpi(2, *SMALL, *POWERSGD, "--epochs", "2", "--ckpt-dir", str(tmp_path / "cut"), "--max-steps", "27",
                    env=one_thread)
    rest = run_mpi(2, *SMALL, *POWERSGD, "--epochs", "2", "--ckpt-dir", str(tmp_path / "cut"), "--resume",
                   env=one_thread)
    assert first.returncode == rest.returncode == 0, rest.stdout
    saved = load(tmp_path / "cut" / "last.pt")
    whole = load(tmp_path / "whole" / "last.pt")
    assert saved["step"] == whole["step"] == 80 and same_tensors(saved["model"], whole["model"])
    compression = saved["grad_compression_per_rank"]
    assert len(compression) == 2 and compression[0]["iter"] == 80  # every rank's own, as tensors and numbers


def test_compression_on_mpis_path_is_refused_naming_gloo_and_nccl():
    line = one_error(train_here("--grad-compression", "powersgd", "--comm", "mpi"))
    assert "runs on torch's DDP communication hooks, which MPI's path replaces: use comm='gloo'" in line
