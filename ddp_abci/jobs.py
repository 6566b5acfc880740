"""`python -m ddp_abci.jobs`: the commands the job scripts and scripts/submit.sh call. They live
in ddp_abci/cluster/jobs.py (the cluster tools); this module keeps the command line's name."""
import sys

from .cluster.jobs import main

if __name__ == "__main__":
    sys.exit(main())
