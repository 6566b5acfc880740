"""The teaching map (docs/accelerate.md), proven: one test per row, each running the Accelerate
behaviour the row states (Accelerate 1.16.0: a newer one that behaves otherwise fails here) and
the raw counterpart the row names. In one process where one process shows it; under mpirun -n 2
(tests/teaching_script.py) where the behaviour is distributed."""
import contextlib
import inspect
import io
import json
import os
import random

import numpy as np
import pytest
import torch

from ddp_abci.assembly import seed_everything
from ddp_abci.autoencoder import LinspaceDataset, autoencoder_optimizer
from ddp_abci.config import TrainConfig
from ddp_abci.data import BatchedView, ShardBatchSampler, batch_fetcher, build_loader, iterate
from ddp_abci.errors import UsageError
from ddp_abci.model import wrap_model
from ddp_abci.parallel.collectives import check_replicas_agree, gather_for_metrics  # noqa: F401  (rows name them)
from ddp_abci.parallel.launch import Launch
from ddp_abci.parallel.process_group import cpu_threads
from ddp_abci.parallel.rendezvous import free_port
from ddp_abci.plan import resolve_comm
from ddp_abci.precision import autocast, resolve_precision
from ddp_abci.steps import Groups, optimizer_step
from ddp_abci.trainer import Trainer
from helpers import REPO, env, on_ranks, run

pytestmark = pytest.mark.untimed

accelerate = pytest.importorskip("accelerate", reason="accelerate comes with the test extra")
from accelerate import Accelerator  # noqa: E402
from accelerate.data_loader import BatchSamplerShard, SeedableRandomSampler  # noqa: E402
from accelerate.state import AcceleratorState, GradientState  # noqa: E402
from accelerate.utils import DataLoaderConfiguration, set_seed  # noqa: E402

CPU = torch.device("cpu")
ONE = Launch(0, 1, 0, 1, "127.0.0.1", 1, "single")


def test_the_map_was_proven_against_accelerate_1_16():
    assert accelerate.__version__ == "1.16.0"
    assert "Accelerate 1.16.0" in (REPO / "docs" / "accelerate.md").read_text()


def one_rank_trainer(config):
    """The raw trainer on one rank around Linear(2, 1) and SGD: sum(model(x)) as the loss."""
    torch.manual_seed(0)
    return Trainer(config, ONE, CPU, model=torch.nn.Linear(2, 1), train_set=torch.ones(4, 2),
                   loss_fn=lambda model, x: model(x).sum(), optimizer=torch.optim.SGD)


@pytest.fixture
def make():
    """An Accelerator in this process, its singleton state reset before and after."""
    def new(**kwargs):
        AcceleratorState._reset_state(True)
        GradientState._reset_state()
        return Accelerator(cpu=True, **kwargs)

    yield new
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


@pytest.fixture(scope="module")
def facts(tmp_path_factory, mpirun):
    out = tmp_path_factory.mktemp("teaching") / "facts.json"
    rendezvous = ("-x", "MASTER_ADDR=127.0.0.1", "-x", f"MASTER_PORT={free_port('127.0.0.1')}")
    proc = run(on_ranks(2, "tests/teaching_script.py", str(out), mpirun_args=rendezvous))
    assert proc.returncode == 0, proc.stdout
    return json.loads(out.read_text())


# -- the teaching table: one test per row, in the table's order -----------------------------

def test_process_start(facts):
    # Accelerate (cpu=True) reads Open MPI's variables and writes torchrun's into os.environ;
    # the raw launch reads mpi4py and writes nothing.
    assert facts["env_before"][1]["RANK"] is None and facts["env_after"][1]["RANK"] == "1"
    assert facts["num_processes"] == [2, 2] and facts["process_index"] == [0, 1]
    code = ("import os, ddp_abci.parallel.launch as l; before = dict(os.environ); l.discover_launch(); "
            "print(dict(os.environ) == before)")
    assert run([os.sys.executable, "-c", code], env=env()).stdout.strip() == "True"


def test_accelerator_opens_the_group_with_threads_shared_out(facts):
    import psutil

    assert facts["backend"] == ["gloo", "gloo"]
    # physical cores / local ranks: rank 0 shared its node with rank 1; rank 1 played a node of
    # its own (local world 1) in the script
    physical = psutil.cpu_count(logical=False)
    assert facts["threads"] == [max(1, physical // 2), max(1, physical // 1)]
    assert cpu_threads(Launch(0, 2, 0, 2, "x", 1, "t"), environ={}) == max(1, (os.cpu_count() or 1) // 2)


def test_mixed_precision_fp16_on_the_cpu(make):
    accelerator = make(mixed_precision="fp16")  # accepted, and trains in plain fp32
    assert (accelerator.mixed_precision, accelerator.scaler, accelerator.native_amp) == ("fp16", None, False)
    with pytest.raises(UsageError, match="fp16 needs a CUDA GPU"):  # the raw trainer refuses it: exit 2
        resolve_precision("fp16", CPU)


def test_split_batches(make):
    assert make(split_batches=True).split_batches is False  # the seed's keyword, ignored
    assert make(dataloader_config=DataLoaderConfiguration(split_batches=True)).split_batches is True
    from ddp_abci.data import per_rank_batch

    assert per_rank_batch(50, 2) == 25  # --bs is the global batch


def test_prepare_model(make):
    accelerator = make(mixed_precision="bf16")
    prepared = accelerator.prepare(torch.nn.Linear(4, 4))
    assert prepared(torch.ones(2, 4)).dtype == torch.float32  # autocast forward, outputs converted to fp32
    raw = wrap_model(torch.nn.Linear(4, 4), CPU, world_size=1)
    with autocast("bf16", CPU):
        assert raw(torch.ones(2, 4)).dtype == torch.bfloat16  # raw: explicit autocast, outputs as computed


def test_prepare_dataloader():
    # BatchSamplerShard with the seedable sampler: each rank a contiguous slice of each global
    # batch, as the raw ShardBatchSampler's contiguous split (strided is DistributedSampler's own).
    ds = LinspaceDataset(num_items=40)
    for rank in range(2):
        sampler = SeedableRandomSampler(range(40), data_seed=7)
        sampler.set_epoch(2)
        theirs = list(BatchSamplerShard(torch.utils.data.BatchSampler(sampler, 10, False), 2, rank,
                                        split_batches=True))
        ours = ShardBatchSampler(ds, Launch(rank, 2, rank, 2, "x", 1, "t"), 5, seed=7, split="contiguous")
        ours.start_epoch(2)
        assert list(ours) == theirs


def test_prepare_optimizer(make):
    accelerator = make()
    model = torch.nn.Linear(2, 1)
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    before = model.weight.detach().clone()
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    assert type(optimizer).__name__ == "AcceleratedOptimizer" and optimizer.step_was_skipped is False
    assert not torch.equal(before, model.weight)
    # raw: steps.optimizer_step tells a step the GradScaler skipped (an fp16 overflow)
    raw = torch.nn.Linear(2, 1)
    raw_optimizer = torch.optim.SGD(raw.parameters(), lr=0.1)
    raw(torch.ones(1, 2)).sum().backward()
    assert optimizer_step(raw_optimizer, torch.amp.GradScaler("cpu", enabled=False)) is False
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
    scaler.scale(raw(torch.ones(1, 2)).sum())  # the scaler's scale exists from its first use
    raw.weight.grad.fill_(float("inf"))
    before = raw.weight.detach().clone()
    assert optimizer_step(raw_optimizer, scaler) is True
    assert torch.equal(before, raw.weight)


def test_accelerator_backward(make):
    accelerator = make(gradient_accumulation_steps=2)
    model = accelerator.prepare(torch.nn.Linear(2, 1, bias=False))
    accelerator.backward(model(torch.ones(1, 2)).sum())  # divided by K
    halved = model.weight.grad.clone()
    model.weight.grad = None
    model(torch.ones(1, 2)).sum().backward()
    torch.testing.assert_close(halved, model.weight.grad / 2)
    # raw: two micro-batches make one step whose gradient is their losses' mean's
    trainer = one_rank_trainer(TrainConfig(global_batch=1, accum=2, lr=1.0))
    before = trainer.built.model.weight.detach().clone()
    trainer.train_step([torch.ones(1, 2), 3 * torch.ones(1, 2)])
    torch.testing.assert_close(before - trainer.built.model.weight, torch.full((1, 2), 2.0))  # (1 + 3) / 2


def test_is_main_process(facts):
    assert facts["process_index"][0] == 0 and Launch(0, 2, 0, 2, "x", 1, "t").is_main


def test_the_epoch_loss_print(facts):
    # The seed prints rank 0's own loss (1.0 here); the mean over ranks is 1.5, by Accelerate's
    # reduce and the raw one, which the trainer's epoch report uses.
    assert facts["loss_own_and_means"] == [[1.0, 1.5, 1.5], [2.0, 1.5, 1.5]]
    assert facts["raw_epoch_loss"][0] == 1.5  # raw: the trainer's epoch line (rank 0), the mean over ranks


def test_end_of_script(facts):
    # end_training() destroys the group; the seed never calls it (nor destroys the group)
    assert facts["group_after_end_training"] == [False, False]
    assert facts["group_after_close"] == [False, False]  # raw: distributed() closes the group on its way out


def test_accumulate(facts):
    # Under accumulate(): no_sync (require_backward_grad_sync False) on all but the K-th micro-batch.
    flags = facts["lookahead"][0]
    assert [sync for _, _, sync in flags[:4]] == [False, True, False, True]
    assert facts["raw_sync"][0] == [False, True]  # raw: steps.grad_sync is DDP's no_sync on all but the last


def test_clip_grad_norm(make):
    accelerator = make()
    model = accelerator.prepare(torch.nn.Linear(3, 1))
    model(torch.ones(1, 3) * 10).sum().backward()
    expected = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
    assert accelerator.clip_grad_norm_(model.parameters(), 1.0) == pytest.approx(expected.item())
    # raw: the trainer unscales before it clips: the norm it reports is the true one, not the scaled
    trainer = one_rank_trainer(TrainConfig(global_batch=1, clip_norm=1.0, lr=1.0))
    trainer.built.scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    result = trainer.train_step([torch.ones(1, 2) * 10])
    assert result.grad_norm == pytest.approx(201 ** 0.5)  # d/dw of w . x + b is x = (10, 10), d/db is 1


def test_gather_reduce_and_gather_for_metrics(make):
    accelerator = make()
    t = torch.tensor([1.0, 2.0])
    assert torch.equal(accelerator.gather(t), t) and torch.equal(accelerator.reduce(t, "sum"), t)
    values, indices = gather_for_metrics(torch.tensor([5.0, 6.0, 5.0]), torch.tensor([0, 1, 0]))
    assert indices.tolist() == [0, 1] and values.tolist() == [5.0, 6.0]  # a repeated item counts once


def test_evaluation(make):
    accelerator = make(mixed_precision="bf16")
    prepared = accelerator.prepare(torch.nn.Linear(4, 4))
    with torch.no_grad():
        assert prepared.eval()(torch.ones(1, 4)).dtype == torch.float32
    from ddp_abci.evaluation import evaluate

    seen = []

    def loss_fn(model, x):
        seen.append(torch.is_autocast_enabled("cpu"))
        return model(x).float().mean()

    evaluate(torch.nn.Linear(4, 4), torch.ones(3, 4), loss_fn, ONE, CPU, "bf16", 2)
    assert seen and all(seen)  # raw: the evaluation runs loss_fn under autocast too


def test_main_process_helpers(make):
    accelerator = make()
    assert accelerator.is_main_process and accelerator.is_local_main_process
    accelerator.wait_for_everyone()
    with accelerator.main_process_first():
        pass
    from ddp_abci.parallel import collectives

    order = []
    collectives.wait_for_everyone()
    with collectives.main_process_first(ONE):
        order.append("rank 0 first")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        collectives.print_main(ONE, "once")
    assert order == ["rank 0 first"] and out.getvalue() == "once\n"


def test_scheduler_steps_only_when_the_optimizer_did(make):
    accelerator = make()
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer,
                                                      torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0))
    optimizer._is_overflow = True  # what GradScaler reports for a skipped fp16 step
    assert optimizer.step_was_skipped
    scheduler.step()
    assert scheduler.scheduler.last_epoch == 0  # it did not step
    # raw: a step the GradScaler skipped is not a step for the schedule either
    trainer = one_rank_trainer(TrainConfig(global_batch=1, warmup_steps=4))
    trainer.built.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**127)  # the scaled loss overflows
    trainer.train_step([1e3 * torch.ones(1, 2)])
    assert trainer.built.scheduler.last_epoch == 0


def test_trackers(make, tmp_path):
    accelerator = make(log_with="tensorboard", project_dir=str(tmp_path))
    accelerator.init_trackers("run")
    accelerator.log({"loss": 1.0}, step=1)
    accelerator.end_training()
    assert list(tmp_path.rglob("events.out.tfevents.*"))  # the main process wrote the events
    from ddp_abci.trackers import TensorBoard

    board = TensorBoard(tmp_path / "raw", 1, {}, None)
    board.log(1, {"loss": 1.0})
    board.close()
    assert list((tmp_path / "raw").glob("events.out.tfevents.*"))  # raw: SummaryWriter's events, rank 0


def test_dynamo_backend_compiles_the_ddp_wrapped_model(facts):
    assert facts["accelerate_compiled"][0] == ["OptimizedModule", "DistributedDataParallel"]
    assert facts["raw_compiled"][0] == ["OptimizedModule", "DistributedDataParallel"]  # the same order


def test_set_seed(make):
    make()
    set_seed(5, device_specific=True)  # + process index (0 here)
    a = (random.random(), np.random.rand(), torch.rand(1).item())
    seed_everything(5 + 0)  # the trainer's seed + rank
    assert a == (random.random(), np.random.rand(), torch.rand(1).item())


def test_device_placement(make):
    accelerator = make()
    loader = accelerator.prepare(torch.utils.data.DataLoader(LinspaceDataset(num_items=4), batch_size=2))
    assert next(iter(loader)).device == accelerator.device == CPU
    from ddp_abci.data import to_device

    assert to_device({"x": [torch.ones(1)]}, CPU)["x"][0].device == CPU


def test_rng_synchronisation_each_epoch():
    sampler = SeedableRandomSampler(range(30), data_seed=4)
    sampler.set_epoch(3)
    ours = ShardBatchSampler(LinspaceDataset(num_items=30), ONE, 30, seed=4)
    ours.start_epoch(3)
    assert list(sampler) == ours.epoch_order()  # seed + epoch on every rank: nothing to synchronise


def test_even_batches():
    theirs = [list(BatchSamplerShard(torch.utils.data.BatchSampler(range(5), 1, False), 2, r)) for r in range(2)]
    assert [len(t) for t in theirs] == [3, 3] and theirs[1][-1] == [0]  # looped back to the start
    ours = [ShardBatchSampler(LinspaceDataset(num_items=5), Launch(r, 2, r, 2, "x", 1, "t"), 1, shuffle=False)
            for r in range(2)]
    for s in ours:
        s.start_epoch(0)
    assert [len(s) for s in ours] == [3, 3] and list(ours[1])[-1] == [0]  # padded with the start


def test_end_training(facts):
    assert facts["group_after_end_training"] == [False, False]
    assert facts["group_after_close"] == [False, False]  # raw: distributed() destroys the group on exit


class Registers:
    """Stands in for the DDP object: keeps what register_comm_hook was given."""

    def __init__(self):
        self.module = torch.nn.Linear(2, 2)

    def register_comm_hook(self, state, hook):
        self.state, self.hook = state, hook


def test_comm_hook_registers_torchs_compression_hook():
    from accelerate.utils import DDPCommunicationHookType, DistributedDataParallelKwargs
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    from ddp_abci.parallel.gradients import Compression, gradient_path

    for kind, theirs, hook in (("powersgd", DDPCommunicationHookType.POWER_SGD, powerSGD_hook.powerSGD_hook),
                               ("fp16", DDPCommunicationHookType.FP16, default_hooks.fp16_compress_hook),
                               ("bf16", DDPCommunicationHookType.BF16, default_hooks.bf16_compress_hook)):
        accelerate_ddp, raw_ddp = Registers(), Registers()
        DistributedDataParallelKwargs(comm_hook=theirs).register_comm_hook(accelerate_ddp)  # what prepare() calls
        gradient_path("gloo", Compression(kind)).register(raw_ddp)
        assert accelerate_ddp.hook is hook and raw_ddp.state.compression.hook is hook  # the same torch hook
    # PowerSGD with torch's defaults in both: rank 1, compressing from step 1,000 on
    assert (accelerate_ddp.state is None) and raw_ddp.state.compression.state is None  # bf16: stateless
    DistributedDataParallelKwargs(comm_hook=DDPCommunicationHookType.POWER_SGD).register_comm_hook(accelerate_ddp)
    theirs, ours = accelerate_ddp.state, Compression("powersgd").state
    assert (theirs.matrix_approximation_rank, theirs.start_powerSGD_iter) == (ours.matrix_approximation_rank,
                                                                             ours.start_powerSGD_iter) == (1, 1000)
    assert set(Compression("powersgd").state_dict()) >= {"iter", "error", "p_memory", "q_memory", "rng"}


# -- the rows a learner trips over ------------------------------------------------------------

def test_the_prepared_scheduler_steps_num_processes_times_per_optimizer_step(facts):
    assert facts["scheduler_last_epoch_after_one_step"] == [2, 2]  # split_batches off, 2 processes
    trainer = one_rank_trainer(TrainConfig(global_batch=1, warmup_steps=4))
    trainer.train_step([torch.ones(1, 2)])
    assert trainer.built.scheduler.last_epoch == 1  # raw: once per optimizer step, whatever the world size


def test_the_prepared_dataloader_reads_one_batch_ahead_and_syncs_on_the_epochs_last_batch(facts):
    flags = facts["lookahead"][0]  # 5 batches, accumulate(K=2): the 5th syncs though its group has 1
    assert [end for end, _, _ in flags] == [False, False, False, False, True]
    assert [sync for _, sync, _ in flags] == [False, True, False, True, True]
    with one_rank_trainer(TrainConfig(global_batch=1)) as trainer:
        groups = Groups(iter([torch.ones(1)] * 5), 2, CPU, False, stream=False, here="rank 0", step=lambda: 0,
                        watchdog=trainer.watchdog)
        assert [len(g.batches) for g in groups] == [2, 2, 1]  # raw: the last group is shorter, and syncs as its last


def test_zero_grad_does_nothing_while_gradients_accumulate(make):
    accelerator = make(gradient_accumulation_steps=2)
    model = torch.nn.Linear(1, 1, bias=False)
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with accelerator.accumulate(model):  # micro-batch 1 of 2: no sync
        accelerator.backward(model(torch.ones(1, 1)).sum())
        optimizer.zero_grad()
    assert model.weight.grad is not None and model.weight.grad.item() == pytest.approx(0.5)
    plain = torch.nn.Linear(1, 1, bias=False)  # a raw loop that zeroes every micro-batch loses them
    for _ in range(2):
        torch.optim.SGD(plain.parameters(), lr=0.1).zero_grad()
        (plain(torch.ones(1, 1)).sum() / 2).backward()
    assert plain.weight.grad.item() == pytest.approx(0.5)  # not 1.0: the first half was thrown away


def test_accelerator_print_prints_once_per_node(facts):
    # Rank 1 played a second node (local rank 0): Accelerate printed on both, print_main on rank 0.
    assert [p["accelerate"] for p in facts["printed"]] == [True, True]
    assert [p["print_per_node"] for p in facts["printed"]] == [True, True]
    assert [p["print_main"] for p in facts["printed"]] == [True, False]


def test_a_short_last_accumulation_group(make):
    # One epoch of 3 micro-batches, K = 2: its last group holds 1. Accelerate divides by K anyway.
    data = torch.arange(1.0, 4.0).reshape(3, 1)
    accelerator = make(gradient_accumulation_steps=2)
    model = accelerator.prepare(torch.nn.Linear(1, 1, bias=False))
    loader = accelerator.prepare(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data), batch_size=1))
    for i, (x,) in enumerate(loader):
        with accelerator.accumulate(model):
            if i == 2:
                model.weight.grad = None
            accelerator.backward(model(x).sum())
    theirs = model.weight.grad.item()  # x = 3, divided by K = 2
    assert theirs == pytest.approx(1.5)
    ours = 3.0 / 1  # the trainer divides by the group's real count (1): the full gradient
    assert theirs / ours == pytest.approx(0.5)



def test_comm_hook_power_sgd_on_gloo_fails_a_model_of_two_buckets(mpirun):
    # 0.6 M parameters: two gradient buckets (DDP's first is 1 MiB). PowerSGD issues its later
    # all-reduces from its futures' callbacks, which gloo runs as each finishes: the ranks' orders
    # of the two buckets' collectives then differ, and gloo aborts on a size mismatch, or a
    # callback waits for a collective the other rank has not issued: until the group's timeout
    # (--timeout 20), or past it (docs/accelerate.md). 60 s, where a run that works takes
    # seconds, stands for "forever".
    model = ("--dim-in", "1000", "--dim-hidden", "300", "--max-steps", "8", "--num-items", "2000")
    rendezvous = ("-x", "MASTER_ADDR=127.0.0.1", "-x", f"MASTER_PORT={free_port('127.0.0.1')}")
    theirs = run(["timeout", "60", *on_ranks(2, "-m", "ddp_abci.compare.accelerate_env", os.sys.executable, "-m",
                                             "ddp_abci.compare.accelerate_variant", *model, "--comm-hook", "power_sgd",
                                             "--comm-state-option", '{"start_powerSGD_iter": 2}', "--timeout", "20",
                                             mpirun_args=rendezvous)])
    failed = ("Received data size doesn't match expected size", "Timed out waiting 20000ms")
    assert theirs.returncode != 0, theirs.stdout
    assert any(line in theirs.stdout for line in failed) or theirs.returncode == 124, theirs.stdout  # timeout(1)
    ours = run(on_ranks(2, "-m", "ddp_abci.train", *model, "--grad-compression", "powersgd",
                        "--powersgd-warmup-steps", "2"))
    assert ours.returncode == 0 and "done: 8 steps" in ours.stdout, ours.stdout  # each bucket in turn

# -- where raw's speed-up comes from: each a switch of the trainer ------------------------------

def test_gradients_through_mpi_instead_of_gloo():
    mpi = Launch(0, 2, 0, 2, "x", 1, "mpi4py", mpi=True)
    assert resolve_comm("mpi", mpi, CPU) == "mpi" and resolve_comm("gloo", mpi, CPU) == "gloo"  # --comm mpi, gloo
    assert resolve_comm("auto", mpi, CPU) == "measure"  # the faster of the two for the model, measured at the start


def test_the_fused_adam():
    params = [torch.nn.Parameter(torch.ones(2))]
    assert autoencoder_optimizer(1e-3, (0.0, 0.99))(params).defaults["fused"] is True
    assert not autoencoder_optimizer(1e-3, (0.0, 0.99), fused=False)(params).defaults["fused"]  # --no-fused-adam


def test_the_batched_fetch():
    ds = LinspaceDataset(num_items=8)
    assert batch_fetcher(ds) is ds and isinstance(batch_fetcher(ds, batched=False), BatchedView)  # --no-batched-fetch
    assert torch.equal(batch_fetcher(ds)[[1, 5]], batch_fetcher(ds, batched=False)[[1, 5]])


def test_the_dataloader_bypass():
    loader = build_loader(LinspaceDataset(num_items=8), ONE, 4)
    loader.sampler.start_epoch(0)
    direct, through = iterate(loader), iterate(loader, direct=False)  # --no-direct-loader
    assert inspect.isgenerator(direct) and type(through).__name__ == "_SingleProcessDataLoaderIter"
    assert all(torch.equal(a, b) for a, b in zip(direct, through, strict=True))


def test_every_switch_is_a_flag_of_the_trainer():
    from ddp_abci.train import build_parser

    text = build_parser().format_help()
    for flag in ("--comm", "--no-fused-adam", "--no-batched-fetch", "--no-direct-loader"):
        assert flag in text
