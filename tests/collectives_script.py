"""Run under mpirun -n 2 by test_everyday_api.py: the collectives, checked on real ranks."""
import sys
import time
from pathlib import Path

import torch

from ddp_abci.autoencoder import LinspaceDataset
from ddp_abci.data import ShardBatchSampler
from ddp_abci.parallel.collectives import gather, gather_for_metrics, main_process_first, reduce, wait_for_everyone
from ddp_abci.parallel.launch import discover_launch
from ddp_abci.parallel.process_group import distributed

marker = Path(sys.argv[1])
launch = discover_launch()
with distributed(launch):
    with main_process_first(launch):
        if launch.is_main:
            time.sleep(0.5)  # rank 1 must wait for this, not race it
            marker.write_text("made by rank 0")
        else:
            assert marker.read_text() == "made by rank 0"
    r = torch.tensor([float(launch.rank)])
    assert gather(r).tolist() == [0.0, 1.0]
    assert reduce(r + 1, "mean").item() == 1.5 and reduce(r + 1, "sum").item() == 3.0
    # 5 items on 2 ranks: DistributedSampler pads rank 1's shard by repeating item 0.
    ds = LinspaceDataset(num_items=5)
    idx = next(iter(ShardBatchSampler(ds, launch, 3, shuffle=False)))
    values, indices = gather_for_metrics(ds[idx][:, -1], torch.tensor(idx))
    assert len(gather(torch.tensor(idx))) == 6  # a plain gather counts the padding
    assert indices.tolist() == [0, 1, 2, 3, 4] and values.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    wait_for_everyone()
    print(f"rank {launch.rank}: collectives ok", flush=True)
