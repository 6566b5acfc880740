"""`python -m ddp_abci.goodput`: a long run's effective training time ratio, predicted. It lives
in ddp_abci/cluster/goodput.py (the cluster tools); this module keeps the command line's name."""
import sys

from .cluster.goodput import main

if __name__ == "__main__":
    sys.exit(main())
