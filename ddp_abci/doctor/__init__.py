"""The doctor: one command, inside the job and under its launcher, that checks the allocation
before a day of training is spent on it, and names the host that is wrong.

    mpirun -n 16 python -m ddp_abci.doctor --ckpt-dir /groups/G/runs/a --json doctor.json

    facts.py     each rank: host, versions (Python, torch, mpi4py, the MPI library, NCCL),
                 devices, threads against the cores it may use, free memory; the clocks
    network.py   all-reduce latency and bus bandwidth over a size sweep, per gradient path (MPI,
                 gloo, NCCL on GPUs), across all ranks, within each host, between neighbouring
                 hosts in pairs (a slow host shows in its two pairs)
    storage.py   write-and-fsync MB/s of the checkpoint folder from each host, reading --data-dir
    verdict.py   the problems, one line each, naming host and figure; the table

Exit 0 when healthy, 1 with the problems' lines; the JSON's top-level keys are ranks, network,
storage, clocks, problems. The job scripts run it first with DOCTOR=1 (docs/abci.md).
"""
