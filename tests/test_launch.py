"""Launch discovery: the launch environments, their order, and the errors that stop a broken launch."""
import socket
import subprocess
import sys

import pytest

from ddp_abci.cluster.schedulers import expand_hostlist
from ddp_abci.environments import (
    ENVIRONMENTS,
    Environment,
    GridEngineJob,
    PBSJob,
    Ranks,
    SingleProcess,
    SlurmJob,
    Srun,
    TorchRun,
    detect_environment,
    job_port,
    launched_rank,
    launched_world_size,
    mpi,
)
from ddp_abci.parallel.launch import LaunchError, discover_launch
from ddp_abci.parallel.rendezvous import (
    AddressUnusable,
    check_bindable,
    free_port,
    interface_address,
    routable_address,
)
from helpers import REPO, env


@pytest.fixture
def no_mpi4py(monkeypatch):
    monkeypatch.setattr(mpi, "have_mpi4py", lambda: False)


TORCHRUN = {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
OMPI = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
PMI = {"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"}
SLURM = {"SLURM_PROCID": "5", "SLURM_STEP_NUM_TASKS": "8", "SLURM_LOCALID": "1",
         "SLURM_STEP_TASKS_PER_NODE": "4(x2)"}
ADDR = {"MASTER_ADDR": "10.0.0.9", "MASTER_PORT": "12345"}


def test_torchrun_variables_win_over_other_launchers_as_the_innermost_one(no_mpi4py):
    got = discover_launch(environ={**OMPI, **PMI, **SLURM, **TORCHRUN})
    assert (got.rank, got.world_size, got.local_rank, got.local_world_size, got.source) == (1, 4, 1, 2, "torchrun")
    assert (got.master_addr, got.master_port) == ("10.0.0.1", 29500)


def test_open_mpi_variables_come_next(no_mpi4py):
    got = discover_launch(environ={**OMPI, **PMI, **SLURM, **ADDR})
    assert (got.rank, got.world_size, got.local_rank, got.local_world_size, got.source) == (3, 4, 1, 2, "ompi-env")


def test_pmi_variables_of_mpich_and_intel_mpi_come_after_open_mpi(no_mpi4py):
    got = discover_launch(environ={**PMI, **SLURM, **ADDR})
    assert (got.rank, got.world_size, got.local_rank, got.local_world_size, got.source) == (2, 4, 0, 2, "pmi-env")


def test_slurm_srun_variables_come_last(no_mpi4py):
    got = discover_launch(environ={**SLURM, **ADDR})
    assert (got.rank, got.world_size, got.local_rank, got.local_world_size, got.source) == (5, 8, 1, 4, "slurm-env")


def test_slurm_batch_script_without_srun_is_one_process(no_mpi4py):
    got = discover_launch(environ={"SLURM_PROCID": "0", "SLURM_NTASKS": "8", "SLURM_LOCALID": "0",
                                   "SLURM_JOB_ID": "77"})
    assert (got.world_size, got.source) == (1, "slurm-job")


def test_nothing_set_means_one_process_on_loopback_with_a_free_port():
    got = discover_launch(environ={})
    assert (got.rank, got.world_size, got.source, got.master_addr) == (0, 1, "single", "127.0.0.1")
    check_bindable(got.master_addr, got.master_port)  # the port is free


def test_explicit_arguments_beat_master_addr_and_port(no_mpi4py):
    got = discover_launch(master_addr="10.1.1.1", master_port=4000, environ={**OMPI, **ADDR})
    assert (got.master_addr, got.master_port) == ("10.1.1.1", 4000)


def test_several_hosts_without_mpi4py_or_master_addr_is_an_error_not_independent_jobs(no_mpi4py):
    with pytest.raises(LaunchError, match="MASTER_ADDR"):
        discover_launch(environ={**OMPI, "MASTER_PORT": "12345"})


def test_several_hosts_without_mpi4py_meet_at_the_first_host_of_the_schedulers_node_file(no_mpi4py, tmp_path):
    nodes = tmp_path / "nodes"
    nodes.write_text("node7\nnode7\nnode8\nnode8\n")  # PBS: one line per MPI slot
    got = discover_launch(environ={**OMPI, "PBS_JOBID": "4321.pbs1", "PBS_NODEFILE": str(nodes)})
    assert (got.master_addr, got.master_port) == ("node7", 10000 + 4321)


def test_srun_tasks_meet_at_the_first_host_of_the_step(no_mpi4py):
    got = discover_launch(environ={**SLURM, "SLURM_JOB_ID": "99", "SLURM_STEP_NODELIST": "gpu[07-08,11]"})
    assert (got.master_addr, got.master_port, got.source) == ("gpu07", 10000 + 99, "slurm-env")


def test_one_host_without_mpi4py_uses_loopback_and_the_job_id_port(no_mpi4py):
    one_host = {**OMPI, "OMPI_COMM_WORLD_LOCAL_SIZE": "4", "PBS_JOBID": "1234.pbs1"}
    got = discover_launch(environ=one_host)
    assert (got.master_addr, got.master_port) == ("127.0.0.1", 10000 + 1234)


def test_no_port_and_no_job_id_without_mpi4py_is_an_error(no_mpi4py):
    with pytest.raises(LaunchError, match="MASTER_PORT"):
        discover_launch(environ={**OMPI, "OMPI_COMM_WORLD_LOCAL_SIZE": "4"})


def test_a_non_integer_variable_is_named(no_mpi4py):
    with pytest.raises(LaunchError, match="WORLD_SIZE='two'"):
        discover_launch(environ={"RANK": "0", "WORLD_SIZE": "two"})


def test_a_port_in_use_is_refused_naming_the_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(AddressUnusable, match=f"port {port} .* already in use"):
            check_bindable("127.0.0.1", port)


def test_an_address_of_another_host_is_refused_on_rank_0():
    with pytest.raises(AddressUnusable, match="not an address of rank 0's host"):
        check_bindable("192.0.2.254", 0)


def test_an_interface_is_resolved_to_its_address():
    assert interface_address("lo") == "127.0.0.1"


def test_an_unknown_interface_lists_the_ones_that_exist():
    with pytest.raises(AddressUnusable, match="lo"):
        interface_address("nosuch0")


def test_the_routable_address_is_never_loopback():
    if all(name == "lo" for _, name in socket.if_nameindex()):
        pytest.skip("this host has only a loopback interface")
    assert not routable_address().startswith("127.")


def test_a_pbs_array_job_id_gives_the_port_of_its_job_number():
    assert job_port({"PBS_JOBID": "1234[5].pbs1"}) == 10000 + 1234
    assert job_port({"PBS_JOBID": "61234.pbs1"}) == 10000 + 61234 % 50000
    assert job_port({"SLURM_JOB_ID": "7"}) == 10007
    assert job_port({"JOB_ID": "8"}) == 10008 and job_port({}) is None


@pytest.mark.parametrize("hostlist,hosts", [("h1", ["h1"]), ("h[1-2,5]", ["h1", "h2", "h5"]),
                                            ("a[07-09],b1", ["a07", "a08", "a09", "b1"]),
                                            ("gpu-[3,1]-x", ["gpu-3-x", "gpu-1-x"]), ("n1,n2", ["n1", "n2"])])
def test_a_slurm_host_list_expands_to_its_hosts_in_order(hostlist, hosts):
    assert expand_hostlist(hostlist) == hosts


@pytest.mark.parametrize("environ,kind", [
    ({**TORCHRUN, **SLURM}, TorchRun), ({**OMPI, **PMI}, mpi.OpenMPI), ({**PMI, **SLURM}, mpi.MPICH),
    (SLURM, Srun), ({"PBS_JOBID": "1.pbs1"}, PBSJob), ({"JOB_ID": "3", "SGE_ROOT": "/x"}, GridEngineJob),
    ({"JOB_ID": "3"}, SingleProcess), ({"SLURM_JOB_ID": "3"}, SlurmJob), ({}, SingleProcess)])
def test_the_registry_picks_the_most_specific_launcher(environ, kind):
    assert type(detect_environment(environ)) is kind
    assert ENVIRONMENTS[-1] is SingleProcess


def test_the_rank_is_sniffed_without_mpi_from_whichever_launcher_started_the_process():
    assert [launched_rank(e) for e in (OMPI, PMI, SLURM, TORCHRUN, {})] == [3, 2, 5, 1, 0]
    assert launched_world_size({**OMPI}) == 4 and launched_rank({"RANK": "x", "WORLD_SIZE": "2"}) == 0


class TwoOfFour(Environment):
    """A launcher of the user's own: rank 2 of 4, two a host, meeting where it says."""

    source = "mine"

    @classmethod
    def detect(cls, environ):
        return "MINE" in environ

    def environ_ranks(self):
        return Ranks(2, 4, 0, 2)

    def rank0_host(self):
        return "head-node"


def test_an_environment_of_ones_own_gives_rank_sizes_and_rank_0s_host():
    got = discover_launch(environment=TwoOfFour({"MASTER_PORT": "4000"}), environ={"MASTER_PORT": "4000"})
    assert (got.rank, got.world_size, got.local_world_size, got.master_addr, got.master_port, got.source) == \
        (2, 4, 2, "head-node", 4000, "mine")
    assert not got.mpi and got.environment.end_job.__func__ is Environment.end_job


def test_with_mpi4py_mpirun_answers_even_where_torchrun_variables_were_copied_in():
    assert type(detect_environment({**TORCHRUN, **OMPI})) is mpi.OpenMPI  # Accelerate copies RANK, WORLD_SIZE


def test_without_mpi4py_torchrun_inside_mpirun_is_the_innermost_launcher(no_mpi4py):
    assert type(detect_environment({**TORCHRUN, **OMPI})) is TorchRun


HELD_UP_RANK_0 = """
import datetime, sys, time
import torch, torch.distributed as dist
from ddp_abci.environments.base import Ranks
from ddp_abci.parallel import rendezvous

rank, port = int(sys.argv[1]), int(sys.argv[2])


class HeldUp(dist.TCPStore):  # rank 0 held up right after the others have its answer, as under load
    def wait(self, *args):
        super().wait(*args)
        time.sleep(2)


dist.TCPStore = HeldUp
addr, kept = rendezvous.learn_rank0_address(Ranks(rank, 2, 0, 1), "127.0.0.1", port, "lo", 10)
if rank == 0:
    time.sleep(2)  # and again before its process group opens
dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=2,
                        timeout=datetime.timedelta(seconds=10))
total = torch.ones(1)
dist.all_reduce(total)
print("met", int(total.item()))
dist.destroy_process_group()
"""


def test_ranks_that_learned_rank_0s_address_meet_its_group_on_the_same_port_however_late_rank_0_comes():
    # torchrun's variables and --interface: rank 1 learns rank 0's address at MASTER_PORT, and the
    # group then meets on that port. Closing the first store and binding the port again let a rank
    # arriving in between meet the closing server and wait out the whole timeout.
    port = str(free_port("127.0.0.1"))
    procs = [subprocess.Popen([sys.executable, "-c", HELD_UP_RANK_0, str(rank), port], cwd=REPO, env=env(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in (0, 1)]
    outputs = [proc.communicate(timeout=60)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outputs
    assert all(out.strip().endswith("met 2") for out in outputs), outputs
