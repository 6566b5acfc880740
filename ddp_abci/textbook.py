"""`python -m ddp_abci.textbook`: the seed's job as PyTorch's DDP tutorial writes it, for comparison.
The command lives here so that the command line stays as documented; its code is in
ddp_abci/compare/textbook.py, with the other comparison tools."""
import sys

from .compare.textbook import main

if __name__ == "__main__":
    sys.exit(main())
