"""What the benchmark's labs share (netlab.py's hosts, slowdisk.py's file system): made in
up(), removed in down(), as a context manager that undoes a set-up that failed half-way."""
from __future__ import annotations


class Lab:
    def up(self) -> None:
        raise NotImplementedError

    def down(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> "Lab":
        try:
            self.up()
        except BaseException:
            self.down()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()
