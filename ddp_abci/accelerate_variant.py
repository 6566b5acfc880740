"""`python -m ddp_abci.accelerate_variant`: the seed's training code on Accelerate, for comparison.
The command lives here so that the command line stays as documented; its code is in
ddp_abci/compare/accelerate_variant.py, with the other comparison tools."""
import sys

from .compare.accelerate_variant import main

if __name__ == "__main__":
    sys.exit(main())
