"""A language model of your own over token shards, as a multi-day run trains one: a GPT in plain
PyTorch (nanoGPT's shape), a corpus of uint16 token files read through memory maps, steps rather
than epochs, evaluation every so many steps, bf16 where the GPU has it (--amp auto). The
recipe around it: docs/abci.md, "A multi-day run of your own model".

    mpirun -n 2 python -m ddp_abci.examples.language_model --data /tmp/tokens --synthetic --max-steps 200 \\
        --eval-every-steps 50 --n-layer 2 --n-embd 64 --block-size 64

--data is a folder of *.bin shards (numpy uint16 tokens, nanoGPT's format); the last shard is
held out for evaluation. A folder without two shards is refused before anything starts (three
days on random tokens would end 0); --synthetic writes a small random corpus there instead, to
try the example. Its own flags (--data, --synthetic, --block-size, --n-layer, --n-head,
--n-embd, --vocab, --eval-windows) come beside the trainer's, which parse_command_line reads as
the job scripts pass them.
"""
import argparse
import os
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ddp_abci import EXIT_USAGE, Evaluation, fit, launched_rank, parse_command_line

OWN = ("--data", "--synthetic", "--block-size", "--n-layer", "--n-head", "--n-embd", "--vocab", "--eval-windows")


class TokenWindows(torch.utils.data.Dataset):
    """Windows of block_size + 1 tokens, back to back over the shards (memory-mapped: a corpus
    larger than memory reads only what is trained). Item i: (input, target), shifted by one."""

    def __init__(self, paths: list[Path], block_size: int) -> None:
        self.maps = [np.memmap(p, dtype=np.uint16, mode="r") for p in paths]
        self.block = block_size
        counts = [len(m) // (block_size + 1) for m in self.maps]
        self.starts = np.cumsum([0] + counts)

    def __len__(self) -> int:
        return int(self.starts[-1])

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        shard = int(np.searchsorted(self.starts, i, side="right") - 1)
        first = (i - int(self.starts[shard])) * (self.block + 1)
        window = torch.from_numpy(self.maps[shard][first:first + self.block + 1].astype(np.int64))
        return window[:-1], window[1:]


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.attn = nn.MultiheadAttention(n_embd, n_head, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        causal = torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), diagonal=1)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=causal, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, block_size: int, n_layer: int, n_head: int, n_embd: int) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, n_embd), nn.Embedding(block_size, n_embd)
        self.blocks = nn.Sequential(*(Block(n_embd, n_head) for _ in range(n_layer)))
        self.ln, self.head = nn.LayerNorm(n_embd), nn.Linear(n_embd, vocab, bias=False)
        self.head.weight = self.tokens.weight  # tied, as GPT-2
        for module in self.modules():  # GPT-2's initialisation: small weights, a loss near log(vocab) at the start
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tokens(idx) + self.positions(torch.arange(idx.shape[1], device=idx.device))
        return self.head(self.ln(self.blocks(x)))


def next_token_loss(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    logits = model(batch[0])
    return nn.functional.cross_entropy(logits.flatten(0, 1), batch[1].flatten())


def write_corpus(folder: Path, vocab: int, shards: int = 4, tokens: int = 200_000) -> None:
    """A random corpus of `shards` files, to try the example where there is none."""
    folder.mkdir(parents=True, exist_ok=True)
    g = np.random.default_rng(0)
    for n in range(shards):  # renamed into place whole: every rank writes the same files, none reads half of one
        part = folder / f".shard-{n:03d}.{os.getpid()}"
        g.integers(0, vocab, tokens, dtype=np.uint16).tofile(part)
        os.replace(part, folder / f"shard-{n:03d}.bin")


def main() -> int:
    config, launch, rest = parse_command_line(global_batch=32, lr=6e-4, betas=(0.9, 0.95), epochs=1,
                                              warmup_steps=100, schedule="cosine", clip_norm=1.0, own=OWN)
    own = argparse.ArgumentParser(prog="python -m ddp_abci.examples.language_model")
    own.add_argument("--data", type=Path, required=True, help="a folder of *.bin token shards (uint16)")
    own.add_argument("--synthetic", action="store_true", help="where --data holds no shards, write a random corpus "
                                                              "there (to try the example)")
    own.add_argument("--block-size", type=int, default=256)
    own.add_argument("--n-layer", type=int, default=12)
    own.add_argument("--n-head", type=int, default=12)
    own.add_argument("--n-embd", type=int, default=768)
    own.add_argument("--vocab", type=int, default=50304)
    own.add_argument("--eval-windows", type=int, default=512, help="held-out windows, from the last shard")
    args = own.parse_args(rest)
    shards = sorted(args.data.glob("*.bin"))
    if not shards and args.synthetic:
        write_corpus(args.data, args.vocab)
        shards = sorted(args.data.glob("*.bin"))
    if len(shards) < 2:
        if launched_rank() == 0:
            held = f"holds {len(shards)} *.bin shard" if args.data.is_dir() else "does not exist"
            print(f"error: --data {args.data} {held}: it needs two or more (the last is held out); write your "
                  "corpus there as uint16 token files (nanoGPT's prepare.py format), or pass --synthetic to try the "
                  "example on random tokens", file=sys.stderr)
        return EXIT_USAGE
    train_set, last = TokenWindows(shards[:-1], args.block_size), TokenWindows(shards[-1:], args.block_size)
    held_out = torch.utils.data.Subset(last, range(min(args.eval_windows, len(last))))
    torch.manual_seed(0)
    model = GPT(args.vocab, args.block_size, args.n_layer, args.n_head, args.n_embd)
    perplexity = lambda model, batch: torch.exp(  # noqa: E731  (one value per item, as metrics give)
        nn.functional.cross_entropy(model(batch[0]).transpose(1, 2), batch[1], reduction="none").mean(1))
    return fit(model, train_set, next_token_loss, config, evaluation=Evaluation(held_out, {"perplexity": perplexity}),
               launch=launch)


if __name__ == "__main__":
    sys.exit(main())
