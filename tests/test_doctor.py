"""The doctor names the bad host: on one host it finds nothing wrong and measures every path;
across three network-namespace hosts it names the one whose link tc throttles, and the one
where the checkpoint folder is read-only. Real ranks under mpirun (ddp_abci.compare.netlab)."""
import json
import os
import shutil
import time

import pytest

from ddp_abci.compare.netlab import NetLab
from helpers import MPIRUN, PYTHON, env, on_ranks, run


@pytest.fixture(scope="module")
def one_host(tmp_path_factory, mpirun):
    d = tmp_path_factory.mktemp("doctor")
    proc = run(on_ranks(2, "-m", "ddp_abci.doctor", "--ckpt-dir", str(d / "ck"), "--json", str(d / "report.json"),
                        "--megabytes", "16"), timeout=120)
    return proc, json.loads((d / "report.json").read_text())


def test_a_healthy_host_gets_exit_0_and_every_section(one_host):
    proc, report = one_host
    assert proc.returncode == 0 and "no problem found" in proc.stdout, proc.stdout
    assert set(report) >= {"ranks", "network", "storage", "clocks", "problems"} and report["problems"] == []
    assert [r["rank"] for r in report["ranks"]] == [0, 1] and report["ranks"][0]["torch"] == report["ranks"][1]["torch"]
    assert report["storage"][0]["ckpt_dir"]["writable"] and report["storage"][0]["ckpt_dir"]["write_mb_s"] > 0
    assert len(report["clocks"]) == 2 and report["seconds"] < 60


def test_every_path_is_swept_from_8_bytes_to_64_mb_with_positive_bus_bandwidth(one_host):
    _, report = one_host
    assert set(report["network"]) == {"mpi", "gloo"}
    for path, scopes in report["network"].items():
        rows = scopes["all"]
        assert rows[0]["bytes"] == 8 and rows[-1]["bytes"] == 64 << 20, path
        assert all(row["busbw_gbps"] > 0 for row in rows if "skipped" not in row), (path, rows)


def test_small_messages_go_faster_through_mpi_than_through_gloo(one_host):
    # As measured here: Open MPI's shared memory answers an 8-byte all-reduce in microseconds,
    # gloo's loopback TCP in tens to hundreds (the table in docs/abci.md, "the doctor").
    _, report = one_host
    mpi, gloo = (report["network"][p]["all"][0]["latency_us"] for p in ("mpi", "gloo"))
    assert mpi < gloo, (mpi, gloo)


@pytest.fixture(scope="module")
def three_hosts(tmp_path_factory, mpirun):
    if os.geteuid() != 0 or not shutil.which("tc"):
        pytest.skip("needs root and tc (iproute2)")
    d = tmp_path_factory.mktemp("three")
    ck = d / "ck"
    ck.mkdir()
    with NetLab(["hosta", "hostb", "hostc"], d, read_only={"hostc": str(ck)}) as lab:
        lab.shape("hostb", "100mbit")
        started = time.monotonic()
        doctor = [PYTHON, "-m", "ddp_abci.doctor", "--ckpt-dir", str(ck), "--json", str(d / "report.json"),
                  "--megabytes", "8", "--largest-mb", "2"]
        cmd = lab.mpirun(MPIRUN, 1, doctor, ["-x", "PATH", "-x", "OMP_NUM_THREADS=1"])
        proc = lab.run_on("hosta", cmd, timeout=120, env=env())
        took = time.monotonic() - started
    return proc, took, json.loads((d / "report.json").read_text()) if (d / "report.json").exists() else None


def test_the_host_whose_link_is_throttled_is_named_within_a_minute(three_hosts):
    proc, took, report = three_hosts
    assert proc.returncode == 1 and took < 60, (took, proc.stdout)
    named = [line for line in proc.stdout.splitlines() if "its mpi all-reduce with its neighbours" in line]
    assert len(named) == 1 and named[0].startswith("problem: host hostb:"), proc.stdout
    assert not any("host hosta:" in p or "host hostc: its" in p for p in report["problems"]), report["problems"]


def test_a_checkpoint_folder_read_only_on_one_host_is_named(three_hosts):
    proc, _, report = three_hosts
    line = next(p for p in report["problems"] if "cannot be written there" in p)
    assert line.startswith("host hostc:") and "Read-only file system" in line, report["problems"]


def test_largest_mb_ends_every_sweep_at_that_size(three_hosts):
    _, _, report = three_hosts
    for path, scopes in report["network"].items():
        assert scopes["all"][-1]["bytes"] == 2 << 20, (path, scopes["all"])
        assert all(row["bytes"] <= 2 << 20 for rows in scopes.values() for row in rows), (path, scopes)
