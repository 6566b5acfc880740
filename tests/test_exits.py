"""The exit statuses (ddp_abci/exits.py): one number and one meaning each, the same in the job
scripts' bash (scripts/lib/exits.sh), in every table the docs show, and in what a job's log says."""
import re
import subprocess

import pytest

from ddp_abci import exits
from ddp_abci.cluster import chain
from helpers import REPO


def test_the_job_scripts_name_each_status_as_exits_py_does():
    names = [m.name for m in exits.MEANINGS.values()]
    script = f"source {REPO}/scripts/lib/exits.sh; " + "; ".join(f'echo "{n}=${n}"' for n in names)
    out = subprocess.run(["bash", "-c", script], stdout=subprocess.PIPE, text=True, check=True).stdout
    assert dict(line.split("=") for line in out.split()) == {m.name: str(s) for s, m in exits.MEANINGS.items()}
    assert {m.name: getattr(exits, m.name) for m in exits.MEANINGS.values()} == \
        {m.name: s for s, m in exits.MEANINGS.items()}


@pytest.mark.parametrize("page", ["README.md", "docs/abci.md", "docs/reliability.md"])
def test_every_table_of_exit_statuses_in_the_docs_is_the_one_exits_py_makes(page):
    text = (REPO / page).read_text()
    tables = re.findall(r"\| status \| meaning \| what to do \|\n(?:\|.*\|\n)+", text)
    assert tables == [exits.table() + "\n"], page


@pytest.mark.parametrize("status", sorted(s for s in exits.MEANINGS if s))
def test_a_jobs_log_says_what_each_status_means_for_the_next_step(status):
    line = chain.explain(status, "7", "/ck")
    assert line == f"job 7: {exits.MEANINGS[status].for_a_job}"
