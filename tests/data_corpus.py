"""The data libraries' test corpus: 1,000 numbered items in 16 shards, written once per test run
in each library's own format (ddp_abci/compare/corpus.py). usage: python tests/data_corpus.py OUT
"""
import sys
from pathlib import Path

from ddp_abci.compare import corpus

# 63 for shards 0-3 and 8-11, 62 for 4-7 and 12-15: dealt out by position to 2 ranks (s mod 2) and then
# 2 workers (s mod 4), every rank gets 500 items and every worker 250.
SIZES = [63 if (s // 4) % 2 == 0 else 62 for s in range(16)]

if __name__ == "__main__":
    corpus.write(Path(sys.argv[1]), SIZES)
