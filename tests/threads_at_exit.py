"""Run under mpirun by the tests: a module's main(), then the threads this rank still has.

A gloo worker thread still alive here lives on into interpreter shutdown, where one that
drops a tensor aborts the exit ("terminate called without an active exception"): rarely,
so the tests check for the thread, which is there every time, not for the abort.
"""
import importlib
import os
import sys

module, *argv = sys.argv[1:]
rc = importlib.import_module(module).main(argv)
names = []
for tid in os.listdir("/proc/self/task"):
    with open(f"/proc/self/task/{tid}/comm") as f:
        names.append(f.read().strip())
names.sort()
print(f"threads at exit: {' '.join(names)}", flush=True)
sys.exit(rc)
