"""Run under mpirun by test_security.py: `python -m ddp_abci.train` with the job's secret read
from a file (the test's, 0600) instead of drawn, so that the test can look for it everywhere and
sign a control request with it. Test-only. usage: known_secret_script.py SECRET_FILE [trainer flags]"""
import sys
from pathlib import Path

from ddp_abci import train
from ddp_abci.parallel import signing

signing.draw = lambda: Path(sys.argv[1]).read_bytes()
sys.exit(train.main(sys.argv[2:]))
