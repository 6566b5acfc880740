"""`python -m ddp_abci.bench`: the benchmark, raw against its peers on the same job.
The command lives here so that the command line stays as documented; its code is in
ddp_abci/compare/bench.py, with the other comparison tools."""
import sys

from .compare.bench import main

if __name__ == "__main__":
    sys.exit(main())
