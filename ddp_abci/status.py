"""`python -m ddp_abci.status CKPT_DIR [--json]`: where a chain of jobs stands. It lives in
ddp_abci/cluster/status.py (the cluster tools); this module keeps the command line's name."""
import sys

from .cluster.status import main

if __name__ == "__main__":
    sys.exit(main())
