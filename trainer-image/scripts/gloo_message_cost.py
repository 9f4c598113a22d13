#!/usr/bin/env python3
"""CPU cost of one Gloo point-to-point message by its size, between two
processes on this machine (TCP over loopback, as the trainer's ranks in
`make bench` and `quota_ranks.sh`).

Rank 0 sends a message of N float32 numbers, rank 1 answers with one
number; each process's CPU time (user + system, all its threads) over
many such round trips is divided by their count. The sizes are measured
in interleaved rounds (every size once per round), so drift hits all of
them alike; the table gives the median over the rounds, and the cost
above the one-number message, which is what the bytes themselves cost.

usage: python gloo_message_cost.py [--sizes 1,15232,262144] [--rounds 3]
           [--trips 2000] [--port 29611]
"""
import argparse
import os
import resource
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def worker(rank, args, out):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    ack = torch.zeros(1)
    for rnd in range(args.rounds):
        for n in args.sizes:
            x = torch.randn(n)
            for _ in range(20):  # warm-up: connections, buffers
                trip(rank, x, ack)
            dist.barrier()
            c0, t0 = cpu_seconds(), time.perf_counter()
            for _ in range(args.trips):
                trip(rank, x, ack)
            c1, t1 = cpu_seconds(), time.perf_counter()
            out.put((rank, rnd, n, (c1 - c0) / args.trips, (t1 - t0) / args.trips))
    dist.destroy_process_group()


def trip(rank, x, ack):
    if rank == 0:
        dist.send(x, 1)
        dist.recv(ack, 1)
    else:
        dist.recv(x, 0)
        dist.send(ack, 0)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1,15232,262144",
                   help="message sizes in float32 numbers, comma-separated "
                        "(default: one number; 7 x (128 + 2048), a 7-sample rank's "
                        "factors of a 2048 x 128 linear layer; that layer's gradient)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--trips", type=int, default=2000, help="round trips per size and round")
    p.add_argument("--port", type=int, default=29611, help="the rendezvous port")
    args = p.parse_args()
    try:
        args.sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        sys.exit(f"--sizes: expected comma-separated integers, got {args.sizes!r}")
    if not args.sizes or min(args.sizes) < 1 or args.rounds < 1 or args.trips < 1:
        sys.exit("--sizes, --rounds and --trips must be positive")

    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    procs = [ctx.Process(target=worker, args=(r, args, out)) for r in range(2)]
    for q in procs:
        q.start()
    rows = [out.get() for _ in range(2 * len(args.sizes) * args.rounds)]
    for q in procs:
        q.join()
        if q.exitcode != 0:
            sys.exit(f"a rank exited with {q.exitcode}")

    def med(rank, n, k):
        return statistics.median(r[k] for r in rows if r[0] == rank and r[2] == n)

    base = min(args.sizes)
    print(f"{'numbers':>9} {'MB':>6} {'sender CPU us':>14} {'receiver CPU us':>16} "
          f"{'wall us':>8} {'above ' + str(base) + ' (sender, receiver)':>30}")
    for n in args.sizes:
        s, r = med(0, n, 3) * 1e6, med(1, n, 3) * 1e6
        w = med(0, n, 4) * 1e6
        ds, dr = s - med(0, base, 3) * 1e6, r - med(1, base, 3) * 1e6
        print(f"{n:>9} {n * 4 / 1e6:>6.3f} {s:>14.0f} {r:>16.0f} {w:>8.0f} "
              f"{ds:>17.0f}, {dr:.0f}")
    print(f"(medians of {args.rounds} interleaved rounds of {args.trips} round trips; "
          "a trip is the message one way and one number back)")


if __name__ == "__main__":
    main()
