"""A fuzzed command line: generated argument vectors over every flag, with valid, boundary
and hostile values. Each is either accepted or refused with exit status 2 and exactly one
`error:` line, never a traceback, and never a changed file in the checkpoint folder.

It runs in this process: everything up to the first step happens for real (the flags, the
configuration, the launch, a world-size-1 process group, the preflight with its file
checks and dry run, the model, loader and optimizer); only the training loop is replaced,
so that an accepted huge --epochs costs nothing.
"""
import contextlib
import hashlib
import io
from dataclasses import fields
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddp_abci import train as cli
from ddp_abci.autoencoder_job import AutoencoderJob
from ddp_abci.config import TrainConfig
from ddp_abci.options import default_of, flag_of
from ddp_abci.parallel.launch import LaunchOptions
from ddp_abci.trainer import Trainer
from helpers import assert_clean, train

pytestmark = pytest.mark.untimed

EXAMPLES = 60  # new lines every run: no example database, not derandomized
# Valid values three times over, so that most generated lines get past the flags and
# exercise the later checks (launch, files, data, model) too.
INTS = ["1", "2", "7", "50"] * 3 + ["0", "-1", "1000000", "10" * 20, "nan", "1.5", "", "abc", "inf", "0x10"]
FLOATS = ["1e-05", "0.5", "3"] * 3 + ["0", "-1", "nan", "inf", "-inf", "1e10", "1e400", "", "x"]
HOSTILE_CHOICES = ["", "FP16", "bogus", "-1"]
# Text options that are neither paths nor choices: the values a user (or a typo) gives them.
# W&B and MLflow are left out of --track here: accepted, they would start real trackers (W&B
# online) for a line the test only parses; tests/test_tracking.py runs them.
TEXTS = {"master_addr": ["127.0.0.1"] * 3 + ["", "256.1.1.1", "no.such.host.invalid"],
         "interface": ["lo", "nope0", ""],
         "track": ["tensorboard"] * 3 + ["", "bogus", "tensorboard,,tensorboard", "TensorBoard", ","],
         "project": ["ddp_abci"] * 3 + ["", "a b/c", "-"],
         "flops_per_token": FLOATS + ["auto"] * 3 + ["AUTO", "6N"]}
UNKNOWN = ["--bogus", "-x", "--lr=", "stray", "--epochs=2=3", "--"]
OPTIONS = [f for cls in (TrainConfig, AutoencoderJob, LaunchOptions) for f in fields(cls) if flag_of(f)]


def paths(root: Path, kind: str) -> st.SearchStrategy:
    base = [str(root / "new" / "out.json")] * 4 + [str(root / "missing" / "deeper" / "x.json"), str(root / "a_folder"),
            str(root / "a_file" / "x.json"), "/proc/no-such/x", "", "/dev/full", str(root / "a_file")]
    if kind == "dir":
        base += [str(root / "ckpt"), str(root / "fresh_ckpt")] * 3
    return st.sampled_from(base)


def values_for(f, root: Path) -> st.SearchStrategy:
    """Every flag's arguments, from what its field says it takes."""
    flag, meta, default = flag_of(f), f.metadata, default_of(f)

    def with_value(values):
        return st.tuples(st.just(flag), values).map(list)

    if meta.get("choices"):
        return with_value(st.sampled_from(list(meta["choices"]) * 3 + HOSTILE_CHOICES))
    if meta.get("path"):
        return with_value(paths(root, "dir" if f.name == "ckpt_dir" else "file"))
    if meta.get("negatable"):
        return st.sampled_from([[flag], ["--no-" + flag[2:]]])
    if isinstance(default, bool):
        return st.just([flag])
    if isinstance(default, tuple):  # --betas B1 B2, and one value too few
        return st.one_of(st.tuples(st.just(flag), *[st.sampled_from(FLOATS)] * len(default)).map(list),
                         st.tuples(st.just(flag), st.sampled_from(FLOATS)).map(list))
    kind = meta.get("kind") or type(default)
    if f.name in TEXTS:
        return with_value(st.sampled_from(TEXTS[f.name]))
    if kind in (int, float):
        return with_value(st.sampled_from(INTS if kind is int else FLOATS))
    return with_value(st.sampled_from(TEXTS[f.name]))  # a new text option: say here what to try on it


def argument(root: Path) -> st.SearchStrategy:
    return st.one_of([values_for(f, root) for f in OPTIONS] + [st.sampled_from([[u] for u in UNKNOWN])])


def test_every_flag_of_every_field_is_fuzzed(tmp_path):
    for f in OPTIONS:
        values_for(f, tmp_path)  # a field the strategies do not know raises here
    assert {"--stop-after", "--tensorboard", "--drop-last", "--find-unused-parameters"} <= {flag_of(f) for f in OPTIONS}


def digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    (root / "a_folder").mkdir()
    (root / "a_file").write_text("not a folder")
    (root / "new").mkdir()
    assert_clean(train("--epochs", "2", "--num-items", "400", "--ckpt-dir", str(root / "ckpt")))
    return root


def run_in_process(argv: list[str], monkeypatch) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with monkeypatch.context() as m:
        m.setattr(Trainer, "run", lambda self: 0)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = cli.main(argv)
            except SystemExit as e:  # argparse's own exit for bad flags
                status = e.code
    return status, out.getvalue(), err.getvalue()


def test_every_generated_command_line_is_accepted_or_one_error_line_with_exit_2(root, monkeypatch):
    tried, refused = [], []

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(st.lists(argument(root), min_size=1, max_size=5))
    def check(args):
        argv = [token for arg in args for token in arg]
        before = digest(root / "ckpt")
        status, out, err = run_in_process(argv, monkeypatch)
        tried.append(argv)
        assert "Traceback" not in out + err, (argv, out, err)
        assert digest(root / "ckpt") == before, argv
        if status == 0:
            return
        refused.append(argv)
        lines = err.splitlines()
        assert status == 2, (argv, status, out, err)
        assert len(lines) == 1 and lines[0].startswith("error: "), (argv, err)

    check()
    print(f"fuzzed command lines: {len(tried)} tried, {len(refused)} refused in one line, "
          f"{len(tried) - len(refused)} accepted")
    assert len(tried) >= EXAMPLES and refused and len(refused) < len(tried)
