"""What is wrong, one line each, naming the host and the figure; and the table rank 0 prints."""
from __future__ import annotations

import statistics

VERSIONS = ("python", "torch", "mpi4py", "mpi_library", "nccl")
SLOW_PAIR = 0.5      # a host's pairs below half the median of the pairs without it
SLOW_STORAGE = 0.1   # a host writing at a tenth of the others' median
CLOCK_S = 1.0        # a clock this far from rank 0's


def problems(report: dict) -> list[str]:
    return [*_versions(report["ranks"]), *_threads(report["ranks"]), *_pairs(report["network"]),
            *_storage(report["storage"]), *_clocks(report["clocks"])]


def _versions(ranks: list[dict]) -> list[str]:
    lines = []
    for r in ranks[1:]:
        for key in VERSIONS:
            if r[key] != ranks[0][key]:
                lines.append(f"host {r['host']} rank {r['rank']}: {key} {r[key]} where rank 0 has {ranks[0][key]}: "
                             "every rank must run the same software (the same image, the same modules)")
    return lines


def _threads(ranks: list[dict]) -> list[str]:
    lines = []
    for host in dict.fromkeys(r["host"] for r in ranks):
        mine = [r for r in ranks if r["host"] == host]
        threads, cpus = sum(r["threads"] for r in mine), mine[0]["host_cpus"]
        cores = int(mine[0]["allocated"]) if str(mine[0]["allocated"]).isdigit() else cpus
        if threads > cores:
            lines.append(f"host {host}: {len(mine)} rank(s) x their threads = {threads} threads on {cores} CPU(s) the "
                         "job may use: set OMP_NUM_THREADS (the job scripts set it from the allocation) or run fewer "
                         "ranks a node")
    return lines


def _largest(rows: list[dict]) -> dict | None:
    measured = [row for row in rows if "busbw_gbps" in row and row["busbw_gbps"]]
    return measured[-1] if measured else None


def _pairs(network: dict) -> list[str]:
    """A host whose pairs (with each neighbour) are all below half the median of the pairs it is
    not in: the host's own link. (Against the median of all pairs, a bad host among three makes
    two pairs of three slow, and the median with them.) Two hosts make one pair: nothing to compare."""
    lines = []
    for path, scopes in network.items():
        pairs = {scope[5:]: rows for scope, rows in scopes.items() if scope.startswith("pair ")}
        if len(pairs) < 3:
            continue
        # Compared at the largest size every pair measured (a slow pair skips the largest).
        size = min(_largest(rows)["bytes"] for rows in pairs.values() if _largest(rows))
        figures = {pair: next(row["busbw_gbps"] for row in rows if row["bytes"] == size)
                   for pair, rows in pairs.items()}
        for host in dict.fromkeys(h for pair in figures for h in pair.split("-")):
            mine = {p: v for p, v in figures.items() if host in p.split("-")}
            others = [v for p, v in figures.items() if p not in mine]
            if others and all(v < SLOW_PAIR * statistics.median(others) for v in mine.values()):
                shown = ", ".join(f"{p} {v:g} GB/s" for p, v in mine.items())
                lines.append(f"host {host}: its {path} all-reduce with its neighbours is below half the other pairs' "
                             f"median ({shown}; the others {statistics.median(others):g} GB/s, at {size / 1e6:g} MB): "
                             "check its network link (interface, speed, cable) or leave the host out")
    return lines


def _storage(storage: list[dict]) -> list[str]:
    lines = []
    for key, verb, done in (("ckpt_dir", "write", "written"), ("data_dir", "read", "read")):
        entries = [s for s in storage if key in s]
        for s in entries:
            if s[key].get("writable") is False or s[key].get("readable") is False:
                lines.append(f"host {s['host']}: {s[key]['folder']} cannot be {done} there ({s[key]['error']})")
        speeds = {s["host"]: s[key][f"{verb}_mb_s"] for s in entries if f"{verb}_mb_s" in s[key]}
        for host, speed in speeds.items():
            others = [v for h, v in speeds.items() if h != host]
            if others and speed < SLOW_STORAGE * statistics.median(others):
                lines.append(f"host {host}: {verb}s {key.replace('_', '-')} at {speed:g} MB/s, a tenth or less of the "
                             f"others' median {statistics.median(others):g} MB/s")
    return lines


def _clocks(clocks: list[dict]) -> list[str]:
    return [f"host {c['host']} rank {c['rank']}: its clock is {c['offset_s']:+.2f} s from rank 0's (the deadline "
            "and the watchdog compare clocks): check NTP there" for c in clocks if abs(c["offset_s"]) > CLOCK_S]


def table(report: dict) -> str:
    """The report as text: ranks, network (the largest size each scope measured), storage, clocks."""
    out = ["ddp_abci doctor: " + f"{len(report['ranks'])} rank(s) on {len({r['host'] for r in report['ranks']})} "
           "host(s)", "", "rank  host          torch         mpi4py  threads/cpus  free MiB  devices"]
    for r in report["ranks"]:
        out.append(f"{r['rank']:>4}  {r['host']:<12}  {r['torch']:<12}  {str(r['mpi4py']):<6}  "
                   f"{r['threads']:>3}/{r['allocated'] or r['host_cpus']:<8}  {str(r['free_memory_mib']):>8}  "
                   f"{', '.join(r['devices'])}")
    out += ["", "path  scope                      8 B latency   largest size   busbw GB/s"]
    for path, scopes in report["network"].items():
        for scope, rows in scopes.items():
            small, big = rows[0], _largest(rows) or {}
            out.append(f"{path:<5} {scope:<26} {small.get('latency_us', float('nan')):>9.1f} us   "
                       f"{big.get('bytes', 0) / 1e6:>9.3f} MB   {big.get('busbw_gbps', float('nan')):>9.3f}")
    for s in report["storage"]:
        for key in ("ckpt_dir", "data_dir"):
            if key in s:
                figure = s[key].get("write_mb_s", s[key].get("read_mb_s", s[key].get("error")))
                out.append(f"storage  {s['host']:<12} {key:<9} {s[key]['folder']}: {figure}")
    spread = max(abs(c["offset_s"]) for c in report["clocks"])
    out += [f"clocks   the largest offset from rank 0's: {spread * 1e3:.1f} ms", ""]
    out += [f"problem: {line}" for line in report["problems"]] or ["no problem found"]
    return "\n".join(out)
