"""A process with no part in the job, run by test_security.py as another Linux user: what it
does to rank 0's rendezvous store, or what it can read. Test-only.

usage: outsider_script.py attack ADDR PORT SECONDS   garbage, forged and replayed values into the
                                                     hang, heartbeat and verdict keys, until the
                                                     store goes or SECONDS pass
       outsider_script.py signed ADDR PORT           one hang request signed with the secret on stdin
                                                     (the control: it must be acted on)
       outsider_script.py search PATH...             the secret (hex on stdin) looked for in every
                                                     /proc/*/cmdline and /proc/*/environ and file under
                                                     PATHs this user can read
"""
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

HANG, VERDICT, BEAT = "ddp_abci/hang", "ddp_abci/verdict", "ddp_abci/heartbeat/{}"


def connect(addr, port):
    import torch.distributed as dist

    return dist.TCPStore(addr, int(port), None, False, timedelta(seconds=5))


def forged(value, step):
    """A seen value with its step changed and its counter raised, the signature kept."""
    stored = json.loads(value)
    beat = json.loads(stored["v"])
    beat.update(step=beat["step"] + step, seq=beat["seq"] + 1000)
    return json.dumps({"c": stored["c"] + 1000, "v": json.dumps(beat), "m": stored["m"]})


def attack(addr, port, seconds):
    store, writes, seen, mine = connect(addr, port), 0, {0: [], 1: []}, set()
    until = time.monotonic() + float(seconds)
    fake_request = json.dumps({"c": 1, "v": json.dumps({"step": 1, "nonce": "outsider"}), "m": "0" * 64})
    try:
        while time.monotonic() < until:
            for rank in (0, 1):
                key = BEAT.format(rank)
                if not store.check([key]):
                    continue
                value = store.get(key).decode()
                if value not in mine:  # the rank's own beat
                    seen[rank].append(value)
                if seen[rank]:
                    lie = forged(seen[rank][-1], 1)
                    mine.add(lie)
                    store.set(key, seen[rank][-1])                           # replayed: its last beat again
                    store.set(key, seen[rank][max(0, len(seen[rank]) - 5)])  # replayed: an older beat
                    store.set(key, lie)                                      # forged: a later step, its old signature
                    writes += 3
            for key, value in ((HANG, "dump your stacks"), (HANG, fake_request), (VERDICT, "rank 1 is frozen")):
                store.set(key, value)
                writes += 1
            store.add("ddp_abci/where-count", 1)
            time.sleep(0.1)
    except Exception as e:  # the job ended: its store went with it
        print(f"outsider: the store went ({type(e).__name__})")
    print(f"outsider: {writes} writes")


def signed(addr, port):
    from ddp_abci.parallel.signing import Signer

    signer = Signer(bytes.fromhex(sys.stdin.read().strip()), f"{addr}:{port}")
    connect(addr, port).set(HANG, signer.sign(HANG, {"step": 1, "nonce": "control"}, 0))
    print("outsider: a signed hang request written")


def search(paths):
    secret = bytes.fromhex(sys.stdin.read().strip())
    needles = (secret, secret.hex().encode(), secret.hex().upper().encode())
    files = [p for p in Path("/proc").glob("[0-9]*/cmdline")] + [p for p in Path("/proc").glob("[0-9]*/environ")]
    for root in paths:
        files += [p for p in Path(root).rglob("*") if p.is_file()] if Path(root).is_dir() else [Path(root)]
    read = refused = 0
    for path in files:
        try:
            data = path.read_bytes()
        except OSError:
            refused += 1
            continue
        read += 1
        if any(n in data for n in needles):
            print(f"outsider: found the secret in {path}")
    print(f"outsider: searched {read} files ({refused} refused)")


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    {"attack": lambda: attack(*args), "signed": lambda: signed(*args), "search": lambda: search(args)}[mode]()
    sys.stdout.flush()
    os._exit(0)
