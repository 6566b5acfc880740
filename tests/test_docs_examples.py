"""What the docs show a command printing is what that command prints: each example block is
compared with the code's own output for the same inputs, and each list the docs keep of the
code's names (the job's settings) with the code's list."""
import json
import os
import re

from ddp_abci import run_folder
from ddp_abci.cluster import status, submission
from ddp_abci.cluster.job import SETTINGS
from helpers import REPO

ABCI = (REPO / "docs" / "abci.md").read_text()
FOLDER = "/groups/GROUP/lm/run1"


def block_after(text: str, first_line: str) -> list[str]:
    """The lines of the fenced block whose first line is `first_line`, that line left out."""
    start = text.index(first_line + "\n")
    return text[start:text.index("```", start)].splitlines()[1:]


def test_the_status_example_in_abci_md_is_the_status_commands_own_output(tmp_path):
    # The chain of section 4: 7 jobs of 4 nodes x 12 h; the second runs, 98,412 steps of 518,400
    # at 2 steps a second (--bs 256: 512 samples/s); the first stopped at its deadline.
    folder, now = tmp_path / "run1", 1_800_000_000.0
    folder.mkdir()
    ids = [f"{n}.pbs1" for n in range(1234, 1241)]
    (folder / "chain.json").write_text(json.dumps({"site": "abci3", "jobs": ids, "node_hours": "336",
                                                   "walltime_s": 43200}))
    (folder / "progress.json").write_text(json.dumps({"step": 98412, "total_steps": 518400, "samples_per_s": 512.0,
                                                      "steps_per_s": 2.0, "job": "1235.pbs1", "unix": now - 8}))
    run_folder.write_status(folder, 75, finished=False, step=85610, rank=0, host="hnode001",
                            line=f"stopped on the --stop-after deadline at epoch 1 batch 85610 (step 85610); "
                                 f"checkpoint {FOLDER}/last.pt; resume with --resume; exit 75")
    (folder / "last.pt").write_bytes(b"")
    os.utime(folder / "last.pt", (now - 760, now - 760))
    states = {ids[0]: "finished (exit 75)", ids[1]: "running", **{job: "held" for job in ids[2:]}}
    printed = status.lines(status.chain_status(str(folder), now=now, states=states))
    shown = block_after(ABCI, f"PYTHONPATH=$PWD python3 -m ddp_abci.status {FOLDER}          # --json for scripts")
    assert [line.replace(str(folder), FOLDER) for line in printed] == shown


def test_the_settings_table_in_abci_md_is_the_jobs_own_list_of_settings():
    table = ABCI.split("| setting | what it does |\n| --- | --- |\n", 1)[1].split("\n\n", 1)[0]
    rows = re.findall(r"^\| `(\w+)` \| (.*) \|$", table, re.M)
    assert dict(rows) == SETTINGS and len(rows) == len(table.splitlines())


def test_submit_carries_every_setting_that_is_set_into_the_settings_file():
    options = submission.parse(["slurm"], {})
    given = {name: f"value-of-{name}" for name in SETTINGS if name != "DRY_RUN"}
    carried = submission.settings(options, 2, "job.x", given, {}, "")
    assert {name: carried[name] for name in given if name not in ("TRAIN_ARGS", "NPROC_PER_NODE")} == \
        {name: value for name, value in given.items() if name not in ("TRAIN_ARGS", "NPROC_PER_NODE")}
    assert "DRY_RUN" not in carried  # a dry run of submit.sh is not the jobs' setting

