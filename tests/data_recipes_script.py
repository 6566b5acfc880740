"""Run under mpirun -n 2 by test_data_libraries.py: docs/data.md's recipes, as a reader copies
them, each after the page's preamble, in a folder of its own beside the sample data.
usage: SCRIPT CORPUS OUT   (CORPUS: what `python -m ddp_abci.compare.corpus` wrote)

Each rank writes OUT/recipes-rRANK.json: each recipe's exit status (its `raise SystemExit(fit(...))`)
and what it printed.
"""
import contextlib
import io
import json
import os
import re
import sys
from pathlib import Path

from ddp_abci import launched_rank
from ddp_abci.compare.corpus import mosaic

corpus, out = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
page = (Path(__file__).parent.parent / "docs" / "data.md").read_text()
section = page.split("## Five recipes", 1)[1].split("\n## ", 1)[0]
preamble, *recipes = re.findall(r"```python\n(.*?)```", section, flags=re.S)
mosaic()  # `from streaming import StreamingDataset` where the package's __init__ cannot load (corpus.py)

results = []
for number, recipe in enumerate(recipes):
    folder = out / f"recipe-{number}"
    folder.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        (folder / "data").symlink_to(corpus)
    os.chdir(folder)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        try:
            exec(compile(preamble + recipe, f"docs/data.md recipe {number}", "exec"), {})
            status = None  # a recipe that ends without its exit status
        except SystemExit as end:
            status = end.code
        except Exception as e:  # a recipe that does not run as written: said, and the next one tried
            status = f"raised {type(e).__name__}: {e}"
    results.append({"recipe": recipe, "status": status, "printed": printed.getvalue()})
(out / f"recipes-r{launched_rank()}.json").write_text(json.dumps(results))
