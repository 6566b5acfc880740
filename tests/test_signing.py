"""The job's secret and the signature on each control value in rank 0's store
(ddp_abci/parallel/signing.py): what checks out, what is refused, where the secret may lie."""
import os
import stat
import time

import pytest

from ddp_abci.parallel import signing

KEY = "ddp_abci/heartbeat/1"


def test_a_value_signed_for_this_job_checks_out_and_reads_back_as_it_was_written():
    signer = signing.Signer(signing.draw(), "10.0.0.1:29500")
    beat = {"seq": 3, "step": 7, "phase": "the gradient all-reduce"}
    assert signer.verify(KEY, signer.sign(KEY, beat, 3).encode()) == beat


@pytest.mark.parametrize("stored", [
    "garbage", b"\xff\xfe", '{"c": 1, "v": "1"}', '{"c": 1, "v": "{\\"step\\": 9}", "m": "00"}'])
def test_garbage_and_unsigned_values_are_refused_and_counted(stored, capsys):
    signer = signing.Signer(signing.draw(), "job", "rank 2")
    assert signer.verify(KEY, stored) is None and signer.rejected == {KEY: 1}
    assert capsys.readouterr().err.startswith(f"warning: rank 2 refused a value written to rank 0's store under {KEY}")


def test_a_value_signed_under_another_key_another_job_or_another_secret_is_refused():
    secret = signing.draw()
    signer = signing.Signer(secret, "10.0.0.1:29500")
    for other in (signing.Signer(secret, "10.0.0.1:29501"), signing.Signer(signing.draw(), "10.0.0.1:29500")):
        assert signer.verify(KEY, other.sign(KEY, {"step": 1}, 1)) is None
    assert signer.verify("ddp_abci/heartbeat/0", signer.sign(KEY, {"step": 1}, 1)) is None


def test_an_older_value_replayed_under_a_key_is_refused_and_the_latest_read_again_is_the_same_value():
    signer = signing.Signer(signing.draw(), "job")
    old, new = signer.sign(KEY, {"seq": 1}, 1), signer.sign(KEY, {"seq": 2}, 2)
    assert signer.verify(KEY, old) == {"seq": 1} and signer.verify(KEY, new) == {"seq": 2}
    assert signer.verify(KEY, new) == {"seq": 2}  # the same beat again: a stale one, for the reader to judge
    assert signer.verify(KEY, old) is None and "replayed" not in signer.summary() and signer.rejected == {KEY: 1}


def test_refusals_are_said_once_a_key_and_summed_in_one_line(capsys):
    signer = signing.Signer(signing.draw(), "job", "rank 0")
    for _ in range(5):
        signer.verify("ddp_abci/hang", "x")
    signer.verify("ddp_abci/verdict", "x")
    assert len(capsys.readouterr().err.splitlines()) == 2
    assert signer.summary() == ("warning: rank 0 refused 6 value(s) in rank 0's store that were not this job's: "
                                "ddp_abci/hang 5, ddp_abci/verdict 1")


def test_the_secret_left_for_ranks_without_mpi_is_readable_by_its_owner_alone(tmp_path):
    path = signing.secret_file("10.0.0.1", 29500, {"DDP_ABCI_SECRETS_DIR": str(tmp_path / "secrets")})
    secret = signing.draw()
    signing.leave(secret, path)
    assert path.read_bytes() == secret and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_a_secrets_folder_other_users_can_enter_is_refused_naming_the_fix(tmp_path):
    folder = tmp_path / "open"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    with pytest.raises(PermissionError, match="chmod 700 it, or set DDP_ABCI_SECRETS_DIR"):
        signing.leave(signing.draw(), folder / "job.key")


def test_a_secret_file_older_than_this_rank_is_an_earlier_jobs_and_not_taken(tmp_path):
    path = tmp_path / "job.key"
    path.write_bytes(signing.draw())
    os.utime(path, (time.time() - 3600, time.time() - 3600))
    assert signing.fetch(path, newer_than=time.time() - 10, timeout_s=0.3) is None
    os.utime(path)
    assert signing.fetch(path, newer_than=time.time() - 10, timeout_s=0.3) == path.read_bytes()
