"""Helpers of scripts/gpu_check.sh (run with the Python that holds CUDA torch).

    gpu_summary.py --environment OUT.json    the GPU, versions, and a measured bf16 matmul peak
    gpu_summary.py --nccl-startup OUT.json   the smallest NCCL start-up: a world of one
    gpu_summary.py WORK_DIR SUMMARY.json N   merge each step's status and figures into one JSON
"""
import json
import socket
import sys
import time
from pathlib import Path

NOTE = ("one GPU: NCCL refuses two ranks on the same GPU, so multi-rank scaling and the all-reduce "
        "across GPUs are not measured here; the 2-rank figures in the README come from CPU ranks")
FIGURES = ("samples_per_s", "final_loss", "precision", "steps", "peak_mem_mib_per_rank", "global_batch")


def environment(out: str) -> None:
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ a
    torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(10):
        a @ a
    torch.cuda.synchronize()
    tflops = 10 * 2 * 8192**3 / (time.perf_counter() - began) / 1e12
    Path(out).write_text(json.dumps({
        "gpu": torch.cuda.get_device_name(0), "gpus": torch.cuda.device_count(),
        "capability": ".".join(map(str, torch.cuda.get_device_capability(0))), "torch": torch.__version__,
        "cuda": torch.version.cuda, "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "bf16_matmul_tflops": tflops}))


def nccl_startup(out: str) -> None:
    began = time.perf_counter()
    import torch
    import torch.distributed as dist

    imported = time.perf_counter()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))
    grouped = time.perf_counter()
    x = torch.ones(1, device="cuda")
    dist.all_reduce(x)
    torch.cuda.synchronize()
    done = time.perf_counter()
    dist.destroy_process_group()
    Path(out).write_text(json.dumps({"import_torch_s": imported - began, "init_process_group_s": grouped - imported,
                                     "first_all_reduce_s": done - grouped}))


def merge(work: Path, out: Path, gpus: int) -> None:
    summary: dict = {"gpus": gpus, "note": NOTE if gpus == 1 else None, "steps": {}}
    env = _read(work / "environment.json")
    summary.update(env or {})
    for status_file in sorted(work.glob("*.status.json")):
        name = status_file.name[: -len(".status.json")]
        entry = _read(status_file) or {}
        figures = _read(work / f"{name}.json") or {}
        if "first_step_unix" in figures and "launched_unix" in entry:
            entry["first_step_s"] = figures["first_step_unix"] - entry["launched_unix"]
        entry.update({k: figures[k] for k in FIGURES if k in figures})
        if name == "nccl_startup":
            entry.update(figures)
        summary["steps"][name] = entry
    large = summary["steps"].get("raw_large_bf16", {})
    if large.get("samples_per_s") and env and env.get("bf16_matmul_tflops"):
        flops_per_sample = 12 * 1000 * 4096  # forward 2 matmuls of 2*1000*4096, backward twice that
        large["tflops"] = large["samples_per_s"] * flops_per_sample / 1e12
        large["fraction_of_matmul_peak"] = large["tflops"] / env["bf16_matmul_tflops"]
    out.write_text(json.dumps(summary, indent=1) + "\n")


def _read(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


if __name__ == "__main__":
    if sys.argv[1] == "--environment":
        environment(sys.argv[2])
    elif sys.argv[1] == "--nccl-startup":
        nccl_startup(sys.argv[2])
    else:
        merge(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))
