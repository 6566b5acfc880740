"""No one outside the job steers it (ddp_abci/parallel/signing.py, docs/security.md): another
Linux user who reaches rank 0's rendezvous store writes garbage, forged and replayed values into
the project's hang, heartbeat and verdict keys, and nothing happens but a count of refusals; a
frozen rank is still named; the job's secret is nowhere that user, or root, can read. A control
run, whose request is signed with the secret, is acted on: the attacks could have worked.

Real ranks under mpirun, as root (the job's user here); the outsider is an unprivileged user
this module creates, running tests/outsider_script.py."""
import os
import re
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from helpers import (
    REPO,
    end_job,
    env,
    error_lines,
    load,
    on_ranks,
    outsider_cmd,
    rank_pids,
    same_tensors,
    wait_for_line,
)

pytestmark = pytest.mark.usefixtures("mpirun")

TIMEOUT = 8  # heartbeats every second; a waiting rank reads them from 2 s on
RUN = ["--epochs", "200", "--num-items", "400", "--timeout", str(TIMEOUT), "--seed", "3"]


def as_outsider(*args: str, stdin: str = "", timeout: float = 60) -> str:
    return subprocess.run(outsider_cmd(*args), input=stdin, cwd="/", stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=timeout).stdout


def start_outsider(*args: str) -> subprocess.Popen:
    return subprocess.Popen(outsider_cmd(*args), cwd="/", stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


class Job:
    """A two-rank run of the seed's job with a secret the test knows, in a folder others can
    read (as a group-readable project folder would be): the run folder and its log."""

    def __init__(self, *args: str) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="ddp-security-"))
        self.folder.chmod(0o755)
        self.secret = os.urandom(32)
        secret_file = self.folder / "the-tests-copy-of-the-secret"
        secret_file.write_bytes(self.secret)
        secret_file.chmod(0o600)
        self.ckpt = self.folder / "run"
        self.proc = subprocess.Popen(on_ranks(2, "tests/known_secret_script.py", str(secret_file), *RUN,
                                              "--ckpt-dir", str(self.ckpt), *args), cwd=REPO, env=env(),
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines = wait_for_line(self.proc, "rendezvous ")
        self.addr, self.port = re.search(r"rendezvous (\S+):(\d+)", lines[-1]).groups()
        self.out = "".join(lines)

    def finish(self, within: float) -> str:
        try:
            self.out += self.proc.communicate(timeout=within)[0]
        finally:
            end_job(self.proc)
        (self.folder / "job.log").write_text(self.out)
        (self.folder / "job.log").chmod(0o644)
        return self.out


def stacks_written(job: Job) -> list[Path]:
    return sorted(job.ckpt.glob("hang-*/rank-*.txt"))


@pytest.fixture(scope="module")
def control(outsider):
    """A run whose one request was signed with the job's secret: acted on, the run goes on."""
    job = Job()
    wait_for_line(job.proc, "epoch 5/")
    said = as_outsider("signed", job.addr, job.port, stdin=job.secret.hex())
    job.finish(within=120)
    yield job, said


@pytest.fixture(scope="module")
def attacked(outsider):
    """A run the outsider writes into from its fifth epoch to its end; what it could read of it,
    and where its store listened, taken while it ran."""
    job = Job()
    wait_for_line(job.proc, "epoch 5/")
    attack = start_outsider("attack", job.addr, job.port, "60")
    listening = subprocess.run(["ss", "-Hltn", f"sport = :{job.port}"], stdout=subprocess.PIPE, text=True).stdout
    ranks = rank_pids(job.proc.pid)
    seen_by_root = b"".join(Path(f"/proc/{pid}/{part}").read_bytes() for pid in [job.proc.pid, *ranks]
                            for part in ("cmdline", "environ"))
    searched_while_running = as_outsider("search", stdin=job.secret.hex())
    job.finish(within=120)
    attacked_by = attack.communicate(timeout=30)[0]
    searched_after = as_outsider("search", str(job.folder), str(Path.home()), stdin=job.secret.hex())
    yield {"job": job, "listening": listening, "seen_by_root": seen_by_root, "attack": attacked_by,
           "searched": searched_while_running + searched_after}


def test_a_request_signed_with_the_jobs_secret_is_acted_on_so_the_attacks_below_could_work(control):
    job, said = control
    assert "a signed hang request written" in said, said
    assert [p.name for p in stacks_written(job)] == ["rank-0.txt", "rank-1.txt"], job.out
    assert job.proc.returncode == 0 and not error_lines(job.out), job.out


def test_an_outsiders_garbage_forged_and_replayed_writes_dump_no_stacks_and_take_no_verdict(attacked):
    job = attacked["job"]
    writes = int(re.search(r"outsider: (\d+) writes", attacked["attack"]).group(1))
    assert writes > 50, attacked["attack"]  # it wrote while the job ran
    assert job.proc.returncode == 0 and not error_lines(job.out) and "Traceback" not in job.out, job.out
    assert not stacks_written(job) and "Thread 0x" not in job.out, job.out


def test_an_attacked_run_ends_with_the_weights_of_one_no_outsider_wrote_into(attacked, control):
    """The control's only outside write made it dump stacks; its training is the untouched run's."""
    assert same_tensors(load(attacked["job"].ckpt / "last.pt")["model"], load(control[0].ckpt / "last.pt")["model"])


def test_the_refused_writes_are_said_once_and_counted_at_the_end(attacked):
    out = attacked["job"].out
    said = [line for line in out.splitlines() if re.match(r"warning: rank \d refused a value", line)]
    assert said and all("ddp_abci/hang" in line or "ddp_abci/verdict" in line for line in said), out
    assert len(said) == len(set(said)), said  # once a key and a rank, not once a write
    counted = re.search(r"warning: rank \d refused (\d+) value\(s\) in rank 0's store that were not this job's: "
                        r"ddp_abci/hang (\d+)", out)
    assert counted and int(counted.group(2)) > 5, out


def test_rank_0s_store_listens_only_on_the_address_the_ranks_dial(attacked):
    listening = attacked["listening"].split()
    local = [field for field in listening if field.endswith(f":{attacked['job'].port}")]
    assert local == [f"{attacked['job'].addr}:{attacked['job'].port}"], attacked["listening"]


def test_the_secret_is_in_no_command_line_environment_file_or_log(attacked):
    job, secret = attacked["job"], attacked["job"].secret
    for needle in (secret, secret.hex().encode()):
        assert needle not in attacked["seen_by_root"]
        for path in job.folder.rglob("*"):
            if path.is_file() and path.name != "the-tests-copy-of-the-secret":
                assert needle not in path.read_bytes(), path
    assert "found the secret" not in attacked["searched"], attacked["searched"]
    assert "(0 refused)" not in attacked["searched"]  # other users' environments are closed to it
    assert "the-tests-copy-of-the-secret" not in attacked["searched"]


def test_a_frozen_rank_is_named_within_the_timeout_though_an_outsider_replays_and_forges_its_heartbeat(outsider):
    job = Job()
    wait_for_line(job.proc, "epoch 5/")
    attack = start_outsider("attack", job.addr, job.port, "60")
    time.sleep(2)  # the outsider has read some of rank 1's beats to replay
    os.kill(sorted(rank_pids(job.proc.pid))[1], signal.SIGSTOP)
    stopped = time.monotonic()
    out = job.finish(within=TIMEOUT + 30)
    took = time.monotonic() - stopped
    attack.kill()
    attack.wait()
    lines = error_lines(out)
    assert job.proc.returncode == 69 and len(lines) == 1 and took < TIMEOUT + 30, (took, out)
    # Named; its host and step too where a beat of its own was read between the outsider's writes
    assert re.match(r"error: rank 1 (\(host [^)]+\) )?stopped answering", lines[0]), lines
    refused = "rank 0 refused a value written to rank 0's store under ddp_abci/heartbeat/1 (its signature"
    assert refused in out, out
