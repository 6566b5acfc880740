"""The Accelerate variant really trains distributed, and the benchmark reports every side it ran:
raw, Accelerate, Fabric, the textbook script, and where raw's lead over the textbook comes from."""
import json
import re
from pathlib import Path

import pytest
import torch

from ddp_abci.parallel.comm_choice import GLOO_MARGIN
from ddp_abci.parallel.rendezvous import free_port
from helpers import (
    BENCH_SMALL,
    PYTHON,
    assert_clean,
    assert_no_thread_outlives_the_process_group,
    bench,
    on_ranks,
    run,
)

pytestmark = pytest.mark.untimed

pytest.importorskip("accelerate", reason="accelerate comes with the test extra: scripts/setup.sh installs it")


def accelerate_run(*args, through=("-m",)):
    rendezvous = ("-x", "MASTER_ADDR=127.0.0.1", "-x", f"MASTER_PORT={free_port('127.0.0.1')}")
    return run(on_ranks(2, *through, "ddp_abci.accelerate_variant", *BENCH_SMALL, *args, mpirun_args=rendezvous))


@pytest.fixture(scope="module")
def variant_run(mpirun):
    """The variant's run on 2 ranks, through tests/threads_at_exit.py (it reports the threads left)."""
    return accelerate_run(through=("tests/threads_at_exit.py",))


def test_the_variant_trains_distributed_with_the_seeds_intended_global_batch(variant_run):
    proc = variant_run
    assert proc.returncode == 0, proc.stdout
    assert "world size 2" in proc.stdout and "split_batches=True, global batch 50" in proc.stdout
    # 400 items / global batch 50 = 8 steps; a rank training alone would take 16.
    assert "global step 8" in proc.stdout


def test_the_seed_as_written_trains_with_bs_times_world_and_says_so(mpirun):
    proc = accelerate_run("--as-written")
    assert proc.returncode == 0, proc.stdout
    assert "Accelerator(split_batches=True) ignored -> split_batches=False, global batch 100" in proc.stdout
    assert "global step 4" in proc.stdout


def test_the_variant_ends_gloos_threads_before_exit(variant_run):
    proc = variant_run
    assert_clean(proc)
    assert_no_thread_outlives_the_process_group(proc)


def test_the_ddp_floor_trains_through_ddp_on_the_trainers_gradient_path_and_frees_the_group(mpirun):
    # --data: each step's batch read from the seed's set (250 steps: past an epoch's end, 200 batches)
    proc = run([*on_ranks(2, "tests/threads_at_exit.py", "ddp_abci.compare.probes"),
                "floor", "--bs", "25", "--threads", "1", "--ddp", "--data", "--steps", "250"])
    assert_clean(proc)
    result = json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])
    assert result["data"] is True
    # --comm auto's measurement, as the trainer makes it: on one host MPI usually wins, but a
    # fresh clone's run measured gloo faster, so the path is checked against the measurement.
    measured = result["measured_ms"]
    assert result["step_ms"] > 0 and measured["mpi"] > 0 and measured["gloo"] > 0
    assert result["comm"] == ("gloo" if measured["gloo"] < GLOO_MARGIN * measured["mpi"] else "mpi")
    assert_no_thread_outlives_the_process_group(proc)


def test_the_paired_loop_cost_alternates_both_floors_and_the_trainer_in_one_pair_of_processes(mpirun, tmp_path):
    out = tmp_path / "loop-cost.json"
    proc = run(on_ranks(2, "-m", "ddp_abci.compare.loop_cost", "--rounds", "2", "--epochs", "1", "--num-items", "400",
                        "--out", str(out)))
    assert proc.returncode == 0, proc.stdout
    report = json.loads(out.read_text())
    assert [list(r) for r in report["rounds"]] == [["floor", "floor + data", "trainer"]] * 2
    assert all(rate > 0 for r in report["rounds"] for rate in r.values())
    assert re.search(r"trainer / floor \d\.\d{3}, trainer / floor \+ data \d\.\d{3}, floor \+ data / floor \d\.\d{3}",
                     proc.stdout), proc.stdout


def test_the_variant_refuses_to_start_without_the_rendezvous_variables(mpirun):
    proc = run(on_ranks(2, "-m", "ddp_abci.accelerate_variant", *BENCH_SMALL))
    assert proc.returncode != 0
    assert "Accelerate needs MASTER_ADDR and MASTER_PORT" in proc.stdout


def _bench(tmp_path, *extra, sides="raw,accelerate"):  # the tests using it ask for mpirun
    return bench(tmp_path, *BENCH_SMALL, *extra, sides=sides)


PEER_SIDES = ("raw", "accelerate", "fabric", "textbook")


@pytest.fixture(scope="module")
def tiny_bench(tmp_path_factory, mpirun):
    """One round of all four sides, the decomposition and the sweep at --bs (eleven mpiruns of
    one small epoch and two floor probes: the decomposition's first entry is the textbook side's
    run, and the sweep's entry takes the four sides' runs and runs raw on one rank)."""
    pytest.importorskip("lightning", reason="lightning comes with the test extra")
    return _bench(tmp_path_factory.mktemp("bench"), "--decompose", "--sweep", "50", sides=",".join(PEER_SIDES))


def test_a_tiny_benchmark_reports_every_side_and_raws_ratio_to_each_peer(tiny_bench):
    proc, report = tiny_bench
    assert proc.returncode == 0, proc.stdout
    assert list(report["sides"]) == list(PEER_SIDES)
    for side in PEER_SIDES:
        s = report["sides"][side]
        assert s["samples_per_s"] > 0 and s["first_step_s"] > 0 and s["wall_s"] > s["first_step_s"]
        assert s["world_size"] == 2 and s["global_batch"] == 50 and len(report["runs"][side]) == 1
    for peer in PEER_SIDES[1:]:
        assert report["ratios"][f"throughput raw / {peer}"] > 0
        assert re.search(rf"throughput raw / {peer}: \d+\.\d\d", proc.stdout)
    assert report["environment"]["torch"] and report["environment"]["accelerate"] and report["environment"]["lightning"]


def test_the_default_sides_are_raw_accelerate_and_raw_on_one_rank():
    from ddp_abci.compare.bench import build_parser

    assert build_parser().parse_args([]).sides == "raw,accelerate,raw1"


def test_an_unknown_side_is_refused_in_one_line_naming_the_sides():
    proc = run([PYTHON, "-m", "ddp_abci.bench", "--sides", "raw,deepspeed"])
    assert proc.returncode == 2
    assert proc.stdout.strip() == ("error: unknown side 'deepspeed' in --sides; use raw, accelerate, raw1, fabric, "
                                   "textbook")


def test_the_peers_report_their_start_up_and_first_step_like_the_raw_side(tiny_bench):
    proc, report = tiny_bench
    for peer in ("fabric", "textbook"):
        side = report["sides"][peer]
        assert {"imports", "rendezvous and group", "preflight, model, DDP", "first step"} <= set(side["startup"])
        assert sum(side["startup"].values()) == pytest.approx(side["first_step_s"], abs=0.5)


def test_the_decomposition_goes_from_the_textbook_to_the_raw_trainer_one_named_switch_at_a_time(tiny_bench):
    from ddp_abci.compare.textbook import SWITCHES

    proc, report = tiny_bench
    entries = report["decomposition"]
    assert entries[0]["change"] == "the textbook script" and entries[0]["flags"] == []
    assert [e["flags"][-1] for e in entries[1:-1]] == [flag for flag, _ in SWITCHES]  # one more flag each
    assert entries[-1]["samples_per_s"] == report["sides"]["raw"]["samples_per_s"]  # ends at the raw side
    assert entries[0]["samples_per_s"] == report["sides"]["textbook"]["samples_per_s"]  # starts at it: not run twice
    assert all(e["samples_per_s"] > 0 for e in entries)
    shares = [e["share_of_raw_lead"] for e in entries[1:]]
    assert sum(shares) == pytest.approx(1.0)  # the steps add up to the whole lead
    assert "where raw's lead over the textbook script comes from" in proc.stdout


def test_the_start_up_phases_of_the_raw_side_are_reported(tiny_bench):
    proc, report = tiny_bench
    phases = report["sides"]["raw"]["startup"]
    assert set(phases) == {"to the interpreter", "imports", "MPI_Init", "rendezvous and group",
                           "preflight, model, DDP", "first step"}
    assert all(v >= 0 for v in phases.values())
    assert sum(phases.values()) == pytest.approx(report["sides"]["raw"]["first_step_s"], abs=0.5)
    assert "start-up of raw (medians): " in proc.stdout


def test_the_accelerate_side_reports_its_start_up_phases_too(tiny_bench):
    proc, report = tiny_bench
    phases = report["sides"]["accelerate"]["startup"]
    assert set(phases) == {"to the interpreter", "imports", "rendezvous and group", "preflight, model, DDP",
                           "first step"}  # no MPI_Init: Accelerate meets the others through env://
    assert all(v >= 0 for v in phases.values())
    assert sum(phases.values()) == pytest.approx(report["sides"]["accelerate"]["first_step_s"], abs=0.5)


def test_a_sweep_reports_each_global_batch_with_its_sides_and_floors(tiny_bench):
    proc, report = tiny_bench
    sweep = report["sweep"]
    assert [entry["global_batch"] for entry in sweep] == [50]  # one batch keeps the test short; a list works alike
    for entry in sweep:
        assert set(entry["sides"]) == {"raw1", *PEER_SIDES}
        assert all(side["samples_per_s"] > 0 and side["first_step_s"] > 0 for side in entry["sides"].values())
        assert entry["sides"]["raw1"]["global_batch"] == 50 and entry["sides"]["raw1"]["world_size"] == 1
        # the floor probes' own runs, one process and 2 ranks in lockstep (compare/probes.py floor)
        assert entry["floors"]["one_process"] > 0 and entry["floors"]["lockstep"] > 0
    # at --bs the entry takes the main round's runs, and runs only raw on one rank
    assert sweep[0]["reused"] == sorted(PEER_SIDES) and sweep[0]["sides"]["raw"] == report["sides"]["raw"]
    assert "(accelerate, fabric, raw, textbook from the main rounds)" in proc.stdout
    chart = re.search(r"^sweep chart: (\S+);", proc.stdout, re.M)[1]
    assert chart.endswith("bench-sweep.png") and Path(chart).exists()


def test_a_failing_side_is_reported_as_failed_not_as_a_number(tmp_path, mpirun):
    proc, report = _bench(tmp_path, "--raw-args", "--dim-in 0")
    assert proc.returncode == 1
    assert report["sides"]["raw"]["failed"] and report["ratios"]["throughput raw / accelerate"] is None
    assert re.search(r"^raw +- +FAILED", proc.stdout, re.M)


def test_a_probe_reports_the_whole_loops_mean_and_its_fastest_block(monkeypatch):
    from ddp_abci.compare import probes as bench_probes

    clock = iter(range(20))  # 5 blocks of 4 calls; a neighbour slows the first block's calls 5×
    now = [0.0]
    monkeypatch.setattr(bench_probes.time, "perf_counter", lambda: now[0])
    costs = [5.0] * 4 + [1.0] * 16

    def call():
        now[0] += costs[next(clock)]

    mean_ms, best_ms = bench_probes._time(call, iters=20, device=torch.device("cpu"), warmup=0, blocks=5)
    assert (mean_ms, best_ms) == (1.8e3, 1e3)  # a floor's rate is the mean, as a trainer's is


def test_the_lockstep_floor_is_the_median_of_its_rounds_and_the_ratio_is_per_rank():
    from ddp_abci.compare.bench import median_floor, ratios

    rounds = [{"samples_per_s": rate, "step_ms": 25e3 / rate, "threads": 1} for rate in (9000.0, 6000.0, 8000.0)]
    floor = median_floor(rounds)
    assert floor["samples_per_s"] == 8000.0 and floor["rounds_samples_per_s"] == [9000.0, 6000.0, 8000.0]
    assert median_floor([{"failed": True}]) == {"failed": True}
    raw = {"samples_per_s": 13600.0, "world_size": 2, "wall_s": 1.0}
    assert ratios({"raw": raw, "accelerate": raw}, {"floor_lockstep": floor})[
        "throughput raw / lockstep floor"] == pytest.approx(0.85)


def test_the_ddp_floors_are_compared_with_the_raw_side_and_with_the_lockstep_floor():
    from ddp_abci.compare.bench import ratios

    raw = {"samples_per_s": 13600.0, "world_size": 2, "wall_s": 1.0}
    out = ratios({"raw": raw, "accelerate": raw}, {"floor_lockstep": {"samples_per_s": 8000.0},
                                                   "floor_ddp": {"samples_per_s": 7200.0},
                                                   "floor_ddp_data": {"samples_per_s": 6800.0}})
    assert out["throughput raw / DDP floor"] == pytest.approx(13600 / 14400)
    assert out["DDP floor / lockstep floor"] == pytest.approx(0.9)
    assert out["throughput raw / DDP floor reading the data"] == pytest.approx(1.0)
    assert out["DDP floor reading the data / DDP floor"] == pytest.approx(6800 / 7200)


def test_the_table_leads_with_the_loop_against_the_floor_that_reads_the_same_data():
    from ddp_abci.compare.bench import format_table

    report = {"sides": {}, "probes": {}, "config": {"bs": 50, "world_size": 2},
              "ratios": {"throughput raw / DDP floor": 0.86, "throughput raw / DDP floor reading the data": 0.94}}
    lines = format_table(report).splitlines()
    assert lines[2] == "the loop against DDP's floor reading the same data: 0.94 (against the floor without data: 0.86)"


def test_the_all_reduce_probe_times_gloo_and_mpi_on_real_ranks(mpirun):
    # (The floor probes, alone and in lockstep, run for real in the sweep's test: its floors.)
    both = run([*on_ranks(2, "-m", "ddp_abci.compare.probes"), "allreduce", "--iters", "25"])
    assert both.returncode == 0, both.stdout
    times = json.loads(both.stdout.splitlines()[-1])
    assert times["world_size"] == 2 and times["gloo_ms"] > 0 and times["mpi_ms"] > 0


def test_sizes_report_each_model_size_with_its_sides_and_ratios(tmp_path, mpirun):
    # One size keeps the test short (each is a run of every side); a list works alike.
    proc, report = _bench(tmp_path, "--sizes", "400x40", "--max-steps", "30", sides="raw,textbook")
    assert proc.returncode == 0, proc.stdout
    sizes = report["sizes"]
    assert [(e["dim_in"], e["dim_hidden"], e["parameters"]) for e in sizes] == [(400, 40, 32440)]
    for entry in sizes:
        assert set(entry["sides"]) == {"raw", "textbook"} and entry["sides"]["raw"]["samples_per_s"] > 0
        assert entry["ratios"]["throughput raw / textbook"] > 0
    assert (tmp_path / "bench-sizes.png").exists()


def test_sizes_are_read_as_a_list_and_a_malformed_one_is_named():
    from ddp_abci.compare.sizes import parameters, parse_sizes

    assert parse_sizes("200x20,400x40") == [(200, 20), (400, 40)] and parameters(200, 20) == 8220
    with pytest.raises(SystemExit, match=r"--sizes '400-40': give DIM_INxDIM_HIDDEN"):
        parse_sizes("200x20,400-40")
