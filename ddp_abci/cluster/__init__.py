"""The cluster tools: what runs on a login node and in a job script's own process, around the
ranks rather than in them. Standard library only, and nothing newer than Python 3.9 (a login
node's python3 runs them with the checkout on PYTHONPATH; none loads torch).

    schedulers.py   one class per batch scheduler (PBS, Grid Engine, Slurm) and the sites built on them
    walltime.py     walltimes in the forms people and schedulers write
    submission.py   scripts/submit.sh: the plan checked before anything is queued, and the jobs submitted
    forwarding.py   the submitting shell's variables that reach every rank, secrets kept out of files
    job.py          a job script's Python half: nodes, ranks, placement, the rank's command, the trainer's
    chain.py        the rules of a chain of jobs: what a job makes of the end before it, and of its own
    restarts.py     training started again inside the same job after a fault, a bad host left out
    status.py       python -m ddp_abci.status: where a chain stands
    goodput.py      python -m ddp_abci.goodput: the share of an allocation spent training, predicted
    jobs.py         python -m ddp_abci.jobs: the commands the job scripts and submit.sh call
"""
