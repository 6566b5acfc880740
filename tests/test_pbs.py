"""ABCI 3.0's path under a real PBS (OpenPBS 23.06: tests/pbs_lab.py), typed as a user types it:
scripts/submit.sh abci3 by an ordinary user, PBS's qsub, its walltime, its qdel, and
scripts/abci/train_abci3.sh inside the jobs. The jobs train tests/paced_script.py, a fit() script
whose steps sleep: a chain of one-minute jobs costs its minutes of waiting, little CPU."""
import hashlib
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from pbs_lab import SECOND, SHARED, USER, PBSLab

from helpers import MPIRUN, PYTHON, REPO, env, job_story, load, on_ranks, run, same_tensors

PACED = str(REPO / "tests" / "paced_script.py")
# What ABCI's modules give a job, here: no container, the venv's Python and mpirun, MPI's own
# transports, both ranks on the node's 2 cores.
SITE = dict(CONTAINER="none", PYTHON=PYTHON, MPIRUN=MPIRUN, MAP_BY="ppr:2:node", MPI_ARGS="--mca btl self,sm,tcp",
            TRAIN_SCRIPT=PACED)
RUN = ["--comm", "mpi", "--save-every-steps", "50"]  # runs compared bit for bit take one all-reduce


@pytest.fixture(scope="module")
def pbs():
    in_ci = os.environ.get("CI") == "true"
    missing = "not root" if os.geteuid() else None if (SHARED / "start-pbs.sh").exists() else \
        f"no OpenPBS build at {SHARED} (the project's shared/pbs; DDP_ABCI_PBS names another)"
    if missing:
        (pytest.fail if in_ci else pytest.skip)(f"no PBS here: {missing}")
    lab = PBSLab(Path(tempfile.mkdtemp(prefix="ddp_abci-pbs-")))  # not under pytest's folder: the job user's
    try:
        lab.up()
    except Exception as e:
        lab.down()
        (pytest.fail if in_ci else pytest.skip)(f"PBS did not start: {e}")
    yield lab
    lab.down()
    shutil.rmtree(lab.root, ignore_errors=True)


def submit(lab: PBSLab, folder: Path, *args: str, nodes: int = 1, **settings: str) -> tuple[list[str], str]:
    """scripts/submit.sh abci3 ... run by the job user; (the job ids it printed, its stderr)."""
    out = lab.as_user(str(REPO / "scripts" / "submit.sh"), "abci3", "-g", "gaa00000", "-n", str(nodes), "-p", "2",
                      *args,
                      **{**SITE, "CKPT_DIR": str(folder / "ck"), "SUBMIT_DIR": str(folder / "submit"),
                         "LOG_DIR": str(folder), **settings})
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout.split(), out.stderr


def outputs(folder: Path, jobs: list[str]) -> list[str]:
    return [next(folder.glob(f"{job.split('.')[0]}.*OU"), Path("/dev/null")).read_text() for job in jobs]


def reference(tmp_path: Path, steps: int) -> dict:
    """The same run uninterrupted, without PBS and without the pace (sleeping changes no number)."""
    proc = run(on_ranks(2, PACED, "--max-steps", str(steps), *RUN, "--pace", "0", "--ckpt-dir", str(tmp_path / "ref")),
               env=env())
    assert proc.returncode == 0, proc.stdout
    return load(tmp_path / "ref" / "last.pt")


@pytest.fixture(scope="module")
def chain(pbs):
    """A run of 800 paced steps as a chain of 1-minute jobs that each stop 40 s before their
    walltime (about 15 s of training a job: three jobs or more)."""
    folder = pbs.user_folder("chain")
    ids, said = submit(pbs, folder, "-t", "00:01:00", "-c", "5", "--", "--max-steps", "800", *RUN, "--pace", "0.05",
                       STOP_MARGIN_S="40")
    infos = [pbs.wait(job, 150) for job in ids]
    return {"ids": ids, "said": said, "infos": infos, "outs": outputs(folder, ids), "folder": folder}


def test_submit_prints_the_chains_ids_one_a_line_and_the_line_that_cancels_them_all(chain):
    ids, said = chain["ids"], chain["said"]
    assert len(ids) == 5 and all(job.endswith(".vm") or "." in job for job in ids)
    jobs_file = next((chain["folder"] / "submit").glob("*.jobs"))
    assert jobs_file.read_text().split() == ids
    assert f"to cancel them all: qdel $(tac {jobs_file})" in said


def test_each_job_of_a_chain_stops_itself_before_pbss_walltime_from_the_walltime_pbs_gives(chain):
    outs, infos = chain["outs"], chain["infos"]
    done = next((i for i, out in enumerate(outs) if "done: 800 steps" in out), None)
    assert done is not None and done >= 2, job_story(outs)  # three jobs at least
    for out, info in zip(outs[:done], infos[:done], strict=True):
        assert "s of walltime left; the trainer stops, saves and exits 75 within" in out, out  # from PBS's qstat -f
        assert "stopped on the --stop-after deadline" in out and info["Exit_status"] == 75, (info, out)
    for out, info in zip(outs[done + 1:], infos[done + 1:], strict=True):  # the rest find it finished
        assert "is finished" in out and "world size" not in out and info["Exit_status"] == 0, out


def test_a_chain_of_pbs_jobs_ends_bit_for_bit_where_one_uninterrupted_run_ends(chain, tmp_path):
    outs = chain["outs"]
    assert all("resume: " in out for out in outs[1:] if "world size" in out), job_story(outs)
    end = load(chain["folder"] / "ck" / "last.pt")
    whole = reference(tmp_path, 800)
    assert end["step"] == whole["step"] == 800 and same_tensors(end["model"], whole["model"])


def test_pbss_own_walltime_kill_loses_at_most_one_save_interval_and_the_next_job_resumes(pbs, tmp_path):
    folder = pbs.user_folder("walltime")
    # No margin: the trainer's --stop-after is the walltime itself, so PBS's SIGTERM (within 2 s of
    # the limit here) comes first, then its SIGKILL 10 s later.
    ids, _ = submit(pbs, folder, "-t", "00:01:00", "-c", "2", "--", "--max-steps", "1200", *RUN, "--pace", "0.05",
                    STOP_MARGIN_S="0")
    first, second = (pbs.wait(job, 150) for job in ids)
    one, two = outputs(folder, ids)
    assert first["Exit_status"] != 0 and "walltime" in first.get("comment", "") + str(first), (first, one)
    saved = [int(line.split()[2]) for line in one.splitlines() if line.startswith("checkpoint: step ")]
    resumed = int(two.split("resume: ")[1].split(" step ")[1].split()[0].rstrip(","))
    assert saved and resumed >= saved[-1] >= resumed - 50, (saved, two)  # the last save, or the stop's
    assert "done: 1200 steps" in two and second["Exit_status"] == 0, two


def test_qdel_of_a_running_chain_keeps_its_work_to_the_last_save_and_runs_no_more_of_it(pbs):
    folder = pbs.user_folder("qdel")
    ids, said = submit(pbs, folder, "-t", "00:05:00", "-c", "3", "--", "--max-steps", "100000", *RUN, "--pace",
                       "0.02")
    pbs.wait(ids[0], 60, state="R")
    deadline = time.monotonic() + 60
    while not (folder / "ck" / "last.pt").exists():
        assert time.monotonic() < deadline, pbs.job(ids[0])
        time.sleep(0.5)
    time.sleep(3)
    cancel = said.split("to cancel them all: ")[1].splitlines()[0]  # what submit.sh told the user to type
    cancelled = pbs.as_user("bash", "-c", cancel)
    assert cancelled.returncode == 0, (cancelled.stderr, outputs(folder, ids))
    first = pbs.wait(ids[0], 60)
    out = outputs(folder, ids[:1])[0]
    state = load(folder / "ck" / "last.pt")  # whole: it loads
    seen = max(int(step) for step in re.findall(r"step (\d+)", out))  # the furthest its log got
    assert state["step"] >= seen - 50, (state["step"], out)  # at most one save interval lost
    for job in ids[1:]:
        info = pbs.job(job)
        assert info.get("job_state") == "F" and "exec_host" not in info, info  # deleted before it ran
    assert first["Exit_status"] != 0


def test_an_input_the_job_refuses_stops_the_chain_every_later_job_exiting_2_at_once(pbs):
    folder = pbs.user_folder("refused")
    # Refused by the job, not by submit.sh, which checks what it can before queueing: whether the
    # nodes have GPUs only the job sees.
    ids, _ = submit(pbs, folder, "-t", "00:01:00", "-c", "3", "--", "--max-steps", "10", "--comm", "nccl")
    infos = [pbs.wait(job, 90) for job in ids]
    outs = outputs(folder, ids)
    assert [info["Exit_status"] for info in infos] == [2, 2, 2], infos
    assert "error: comm (--comm) nccl needs CUDA GPUs" in outs[0], outs[0]
    for out in outs[1:]:
        assert "the chain stops: an earlier job ended with 2" in out and "world size" not in out, out


def test_the_job_user_is_not_root_as_on_abci(pbs, chain):
    assert chain["infos"][0]["euser"] == USER


# Across the two hosts: MPI's traffic on the lab's bridge, and mpirun's daemon on the second host
# started through PBS itself (the nodes have no ssh between them: scripts/lib/pbs_remote_shell.sh).
def across(lab: PBSLab) -> dict[str, str]:
    return dict(MPI_ARGS=f"--prtemca plm_ssh_agent {REPO}/scripts/lib/pbs_remote_shell.sh --mca btl self,sm,tcp "
                         f"--mca btl_tcp_if_include {lab.net} --prtemca oob_tcp_if_include {lab.net}")


@pytest.fixture(scope="module")
def two_hosts(pbs):
    pbs.add_second_host()
    return pbs


# In-job restarts (issue 66): a fault that may mend costs the job a restart, not its allocation.
def _restart_job(pbs: PBSLab, name: str, steps: int, **settings: str) -> tuple[Path, str]:
    folder = pbs.user_folder(name)
    ids, _ = submit(pbs, folder, "-t", "00:04:00", "--", "--max-steps", str(steps), "--timeout", "6", *RUN,
                    "--pace", "0.03", nodes=2, **across(pbs), **settings)
    pbs.wait(ids[0], 60, state="R")
    return folder, ids[0]


def _until(done, limit: float, what: str) -> None:
    deadline = time.monotonic() + limit
    while not done():
        assert time.monotonic() < deadline, f"{what}\n{_running_output()}"
        time.sleep(0.2)


def _running_output() -> str:
    """What the running jobs printed so far (PBS keeps it in a MOM's spool until the job ends),
    and the progress files of the lab's run folders."""
    spools = [*Path("/var/spool/pbs/spool").glob("*.OU"), *Path(f"/var/spool/pbs-{SECOND}/spool").glob("*.OU"),
              *Path("/tmp").glob("ddp_abci-pbs-*/work/*/ck/progress.json")]
    return "\n".join(f"--- {path}:\n{path.read_text(errors='replace')[-3000:]}" for path in spools)


def _tries(folder: Path) -> list[dict]:
    path = folder / "ck" / "tries.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _saved(folder: Path) -> int:
    try:
        return load(folder / "ck" / "last.pt")["step"]
    except (OSError, RuntimeError, EOFError):
        return -1


def _training_since(folder: Path, unix: float) -> bool:
    """A try that started after `unix` has taken its first step (progress.json says so)."""
    try:
        progress = json.loads((folder / "ck" / "progress.json").read_text())
    except (OSError, ValueError):
        return False
    return (progress.get("started_unix") or 0) > unix and bool(progress.get("first_step_unix"))


def _kill_a_rank(pbs: PBSLab, host: str, sig: signal.Signals = signal.SIGKILL) -> float:
    second = set(pbs.second_host_pids("paced_script.py"))
    everywhere = [int(p) for p in subprocess.run(["pgrep", "-f", "paced_script.py"], stdout=subprocess.PIPE,
                                                 text=True).stdout.split()]
    pids = sorted(second) if host == SECOND else [p for p in everywhere if p not in second]
    assert pids, (host, everywhere)
    for pid in pids[-1:] if sig == signal.SIGKILL else pids:
        os.kill(pid, sig)
    return time.time()


def test_a_rank_killed_on_each_host_in_turn_costs_the_job_two_restarts_and_it_ends_bit_for_bit(two_hosts, tmp_path):
    pbs = two_hosts
    folder, job = _restart_job(pbs, "killed", 600)
    kills = []
    for host in ("the first host", SECOND):  # one rank on either host: no host to blame twice
        since = _tries(folder)[-1]["ended_unix"] if _tries(folder) else 0
        _until(lambda s=since: _training_since(folder, s) and _saved(folder) >= (kills[-1][1] if kills else 0) + 100,
               120, f"no save 100 steps on ({_tries(folder)})")
        saved = _saved(folder)
        kills.append((_kill_a_rank(pbs, host), saved))
    info = pbs.wait(job, 180)
    log, tries = outputs(folder, [job])[0], _tries(folder)
    assert info["Exit_status"] == 0 and "done: 600 steps" in log, (info, log[-3000:])
    assert [t["status"] for t in tries] == [69, 69, 0], tries
    for (killed_at, saved), next_try in zip(kills, tries[1:], strict=True):
        back = next_try["first_step_unix"] - killed_at
        print(f"killed at step {saved}+: training again {back:.1f} s later, from step {next_try['step_from']}")
        assert back <= 30, (back, next_try)  # from the failure to the first step after resume
        assert next_try["step_from"] >= saved, (saved, next_try)  # at most the save interval lost
    end, whole = load(folder / "ck" / "last.pt"), _reference_4(tmp_path, 600)
    assert end["step"] == whole["step"] == 600 and same_tensors(end["model"], whole["model"])
    state = json.loads(pbs.as_user(PYTHON, "-m", "ddp_abci.status", str(folder / "ck"), "--json",
                                   PYTHONPATH=str(REPO)).stdout)
    assert [r["status"] for r in state["goodput"]["restarts"]] == [69, 69] and 0 < state["goodput"]["ettr"] < 1


def _reference_4(tmp_path: Path, steps: int) -> dict:
    """The same run uninterrupted on 4 ranks of this host (the lab's 2 hosts x 2), without the pace."""
    proc = run(on_ranks(4, PACED, "--max-steps", str(steps), *RUN, "--pace", "0", "--ckpt-dir", str(tmp_path / "r4")),
               env=env())
    assert proc.returncode == 0, proc.stdout
    return load(tmp_path / "r4" / "last.pt")


def test_a_host_that_fails_two_tries_in_a_row_is_left_out_and_the_job_ends_on_the_other(two_hosts):
    pbs = two_hosts
    folder, job = _restart_job(pbs, "failing", 500)
    _until(lambda: _saved(folder) >= 50, 120, "no first save")
    first = _kill_a_rank(pbs, SECOND)
    _until(lambda: _training_since(folder, first), 120, f"no second try: {_tries(folder)}")
    _kill_a_rank(pbs, SECOND)  # as a host whose GPU fails each time it is used
    info = pbs.wait(job, 180)
    log, tries = outputs(folder, [job])[0], _tries(folder)
    assert info["Exit_status"] == 0 and "done: 500 steps" in log, (info, log[-3000:])
    assert [t["status"] for t in tries] == [69, 69, 0] and SECOND not in tries[2]["hosts"], tries
    assert len(tries[2]["hosts"]) == 1 and "world size 2 (local 2)" in log, log[-3000:]
    left = json.loads((folder / "ck" / "bad_hosts.json").read_text())["hosts"]
    assert [h["host"] for h in left] == [SECOND] and "two tries in a row ended with it" in left[0]["why"], left
    assert f"training again in this job without {SECOND} (two tries in a row" in log, log[-3000:]


def test_a_frozen_rank_is_named_and_the_job_trains_on_without_its_host_within_timeout_and_30_s(two_hosts):
    pbs = two_hosts
    folder, job = _restart_job(pbs, "frozen", 400)
    _until(lambda: _saved(folder) >= 50, 120, "no first save")
    frozen = _kill_a_rank(pbs, SECOND, signal.SIGSTOP)  # as a node stuck on its file system
    info = pbs.wait(job, 180)
    log, tries = outputs(folder, [job])[0], _tries(folder)
    assert "2 node(s) x 2 rank(s) = 4" in log and "world size 4 (local 2)" in log, log  # PBS_NODEFILE: both hosts
    assert tries[0]["status"] == 69 and f"(host {SECOND}) stopped answering" in tries[0]["line"], tries
    back = tries[1]["first_step_unix"] - frozen
    print(f"frozen rank: training again without {SECOND} {back:.1f} s later")
    assert back <= 6 + 30 and SECOND not in tries[1]["hosts"], (back, tries, log[-4000:])
    assert tries[1]["step_from"] >= 50 and tries[1]["step_from"] % 50 == 0, tries  # the last save point
    assert info["Exit_status"] == 0 and "done: 400 steps" in log, (info, log[-3000:])
    left = json.loads((folder / "ck" / "bad_hosts.json").read_text())["hosts"]
    assert left[0]["host"] == SECOND and "the watchdog named it" in left[0]["why"], left


def test_the_status_command_shows_the_chain_each_job_as_pbs_has_it_and_the_runs_end(pbs, chain):
    out = pbs.as_user(PYTHON, "-m", "ddp_abci.status", str(chain["folder"] / "ck"), "--json",
                      PYTHONPATH=str(REPO))  # as on a login node: the user, PBS's commands, no job
    state = json.loads(out.stdout)
    assert [job["id"] for job in state["jobs"]] == chain["ids"], out.stderr
    assert all(job["state"].startswith("finished (exit ") for job in state["jobs"]), state["jobs"]
    assert state["finished"] and state["last_exit"]["status"] == 0 and state["step"] == 800
    assert state["site"] == "abci3" and state["node_hours"] == "0.0833333", state  # 5 jobs x 1 node x 1 minute


# Your packages and your environment on every rank of a two-host job (issue 64): a package of the
# user's own installed the documented way without a rebuild (scripts/container/make_venv.sh, VENV),
# variables set before submit.sh (HF_* by default, MY_* through FORWARD_ENV), and a token whose
# value travels in no file others can read, no log and no command line.
OKPKG = """[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"
[project]
name = "okpkg"
version = "1.0"
dependencies = ["numpy"]
"""


def _wheel(folder: Path) -> Path:
    """The user's own package as a wheel, built here offline (what pip would fetch from an index)."""
    source = folder / "okpkg-src"
    (source / "okpkg").mkdir(parents=True)
    (source / "okpkg" / "__init__.py").write_text("")
    (source / "pyproject.toml").write_text(OKPKG)
    subprocess.run([PYTHON, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(folder / "wheels"), str(source)], check=True, stdout=subprocess.DEVNULL)
    for path in (folder / "wheels", *(folder / "wheels").iterdir()):
        shutil.chown(path, USER, USER)
    return next((folder / "wheels").glob("okpkg-*.whl"))


def _cmdlines() -> str:
    """Every process's command line, as /proc shows it to anyone on the host (both hosts: one kernel)."""
    out = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            out.append(cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            pass
    return "\n".join(out)


@pytest.fixture(scope="module")
def user_environment(two_hosts):
    pbs = two_hosts
    folder = pbs.user_folder("environment")
    made = pbs.as_user(str(REPO / "scripts" / "container" / "make_venv.sh"), str(folder / "venv"), "--no-index",
                       str(_wheel(folder)), CONTAINER="none", PYTHON=PYTHON)
    assert made.returncode == 0, made.stdout + made.stderr
    token = secrets.token_hex(16)
    # The token reaches submit.sh as it would from the user's shell: in its environment, not on a
    # command line (a file only the user reads, sourced by the user's own shell).
    secret = folder / "token.env"
    secret.write_text(f"HF_TOKEN={token}\n")
    secret.chmod(0o600)
    shutil.chown(secret, USER, USER)
    settings = {**SITE, "CKPT_DIR": str(folder / "ck"), "SUBMIT_DIR": str(folder / "submit"), "LOG_DIR": str(folder),
                "TRAIN_SCRIPT": str(REPO / "tests" / "rank_env_script.py"), "VENV": str(folder / "venv"),
                "HF_HOME": "/hf/home", "MY_SETTING": "mine", "FORWARD_ENV": "MY_*", **across(pbs)}
    out = pbs.as_user("bash", "-c", f'set -a; . {secret}; set +a; exec {REPO}/scripts/submit.sh "$@"', "submit.sh",
                      "abci3", "-g", "gaa00000", "-n", "2", "-p", "2", "-t", "00:02:00", "--", "--max-steps", "60",
                      "--token-sha", hashlib.sha256(token.encode()).hexdigest(), "--pace", "0.1", **settings)
    secret.unlink()
    assert out.returncode == 0, out.stdout + out.stderr
    job, cmdlines = out.stdout.split()[0], []
    while pbs.job(job).get("job_state") != "F":
        cmdlines.append(_cmdlines())
        time.sleep(0.3)
    return {"info": pbs.wait(job, 150), "log": outputs(folder, [job])[0], "said": out.stdout + out.stderr,
            "token": token, "cmdlines": cmdlines, "folder": folder}


def test_a_package_in_the_documented_venv_is_imported_by_every_rank_of_a_two_host_job(user_environment):
    log = user_environment["log"]
    ranks = re.findall(r"rank (\d) on (\S+): okpkg okpkg from (\S+);", log)
    assert sorted(rank for rank, _, _ in ranks) == ["0", "1", "2", "3"], log
    hosts = {host for _, host, _ in ranks}
    assert len(hosts) == 2 and SECOND in hosts, ranks
    assert all(path.startswith(str(user_environment["folder"] / "venv")) for _, _, path in ranks), ranks
    assert user_environment["info"]["Exit_status"] == 0 and "done: 60 steps" in log, log


def test_variables_set_before_submit_reach_every_rank_and_the_tokens_value_goes_nowhere_others_read(user_environment):
    log, token = user_environment["log"], user_environment["token"]
    reached = re.findall(r"HF_HOME=(\S+) MY_SETTING=(\S+) token arrived: (\w+)", log)
    assert reached == [("/hf/home", "mine", "True")] * 4, log
    assert len(user_environment["cmdlines"]) > 3 and not any(token in seen for seen in user_environment["cmdlines"])
    assert token not in user_environment["said"]
    for path in user_environment["folder"].rglob("*"):  # the settings file, the job's log, the run folder
        if path.is_file() and "venv" not in path.parts:
            assert token.encode() not in path.read_bytes(), path
    home = Path(pwd.getpwnam(USER).pw_dir) / ".ddp_abci" / "secrets"
    assert not list(home.glob("*.env")), list(home.iterdir())  # removed when the chain (one job) ended
    assert "HF_TOKEN reach every rank by name" in user_environment["said"]
