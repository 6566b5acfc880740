"""`python -m ddp_abci.fabric_variant`: the seed's job on Lightning Fabric, for comparison.
The command lives here so that the command line stays as documented; its code is in
ddp_abci/compare/fabric_variant.py, with the other comparison tools."""
import sys

from .compare.fabric_variant import main

if __name__ == "__main__":
    sys.exit(main())
