#!/usr/bin/env python3
"""What a ctypes binding (one py3-none wheel for every CPython) would add to
gac's Python step, against reading the tensors alone, in one process.

gac's pybind11 module reads each parameter's data_ptr(), dtype and shape
through torch's Python API and hands C++ the values without building any
Python object. A C ABI behind ctypes has to pack them into ctypes arrays
first. This times, over N small tensors (default 2,000, the host-overhead
workload of bench/python_agent_bench.py), reading data_ptr() and numel()
of each (the baseline), and the same plus packing both into ctypes arrays
and one ctypes call; it prints both and their ratio (docs/PYTHON.md,
"Install": why one wheel per CPython).
Usage: python bench/ctypes_binding_cost.py [--tensors N] [--repeat R]"""
import argparse
import ctypes
import timeit

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tensors", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    ts = [torch.zeros(16) for _ in range(args.tensors)]
    memset = ctypes.CDLL(None).memset  # any C function taking a pointer: the call itself

    def read() -> None:
        [t.data_ptr() for t in ts]
        [t.numel() for t in ts]

    def read_pack_call() -> None:
        ptrs = (ctypes.c_void_p * len(ts))(*[t.data_ptr() for t in ts])
        sizes = (ctypes.c_int64 * len(ts))(*[t.numel() for t in ts])
        memset(ptrs, 0, 0)
        memset(sizes, 0, 0)

    n = 200
    base, packed = [], []
    for _ in range(args.repeat):  # interleaved: a drifting machine affects both alike
        base.append(timeit.timeit(read, number=n) / n)
        packed.append(timeit.timeit(read_pack_call, number=n) / n)
    b, p = sorted(base)[len(base) // 2], sorted(packed)[len(packed) // 2]
    print(f"{args.tensors} tensors, medians of {args.repeat}: read {b * 1e6:.0f} us; "
          f"read + ctypes arrays + call {p * 1e6:.0f} us; ratio {p / b:.2f}, ctypes adds {(p - b) * 1e6:.0f} us")


if __name__ == "__main__":
    main()
