"""A process group of W local processes on 127.0.0.1 (gloo by default), started from Python: the
tests, `make demo` and bench/ep_bench.py use it; `torchrun` is the launcher for real runs."""
from __future__ import annotations

import datetime
import io
import os
import queue
import time
import traceback
from typing import Any, Callable, List

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _child(rank: int, world: int, port: int, backend: str, collective_timeout: float, threads: int,
           results, target: Callable, args: tuple) -> None:
    try:
        if threads > 0:
            torch.set_num_threads(threads)
        store = dist.TCPStore("127.0.0.1", port, world, False, timeout=datetime.timedelta(seconds=60))
        dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=collective_timeout))
        value = target(rank, world, *args)
        # Tensors travel inside torch.save bytes, not through shared memory (this process exits
        # before the parent reads them).
        buffer = io.BytesIO()
        torch.save(value, buffer)
        results.put((rank, True, buffer.getvalue()))
    except BaseException:  # report everything, including a failed assertion, to the parent
        results.put((rank, False, traceback.format_exc()))
    results.close()
    results.join_thread()
    # Leave without destroy_process_group: a rank whose peers failed would wait on them there.
    os._exit(0)


def _stop(processes: List[Any]) -> None:
    """Terminates the started processes and reaps them (killed if a terminate is not enough)."""
    for process in processes:
        process.terminate()
    for process in processes:
        process.join(timeout=5.0)
        if process.is_alive():
            process.kill()
            process.join()


def run_local(target: Callable, world: int, *args, timeout: float = 120.0, collective_timeout: float = 30.0,
              backend: str = "gloo", threads: int = 1) -> List[Any]:
    """Runs target(rank, world, *args) in `world` new processes joined in one process group
    (default group initialised, rendezvous on a TCPStore this process serves on 127.0.0.1) and
    returns their return values by rank.

    Args:
        target: a module-level function (it is pickled by name into the spawned processes).
        world: the number of processes.
        timeout: seconds for the whole run; processes still running then are killed.
        collective_timeout: the process group's timeout for each collective.
        backend: "gloo" (CPU tensors) or "nccl" (one GPU per rank).
        threads: torch.set_num_threads in each process (0: leave the default).

    Raises:
        RuntimeError: a process raised (its traceback is in the message), died, or ran past timeout.
        Whatever starting a process raised (OSError, ...), once the processes already started
        are terminated and reaped.
    """
    store = dist.TCPStore("127.0.0.1", 0, world + 1, True, timeout=datetime.timedelta(seconds=60),
                          wait_for_workers=False)
    context = mp.get_context("spawn")
    results = context.Queue()
    processes = [context.Process(target=_child, args=(rank, world, store.port, backend, collective_timeout, threads,
                                                      results, target, args), daemon=True)
                 for rank in range(world)]
    # The children inherit the environment at start: keep gloo on the loopback interface there.
    previous = os.environ.get("GLOO_SOCKET_IFNAME")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    try:
        for started, process in enumerate(processes):
            try:
                process.start()
            except BaseException:
                # The ranks already running would wait for the missing one at the rendezvous
                # until the store's timeout: end them before reporting why this one did not start.
                _stop(processes[:started])
                raise
    finally:
        if previous is None:
            del os.environ["GLOO_SOCKET_IFNAME"]
    deadline = time.monotonic() + timeout
    values: dict = {}
    failures: dict = {}
    pending = set(range(world))
    exited_at: dict = {}
    try:
        while pending:
            try:
                rank, ok, value = results.get(timeout=0.2)
            except queue.Empty:
                now = time.monotonic()
                for r in sorted(pending):
                    if not processes[r].is_alive():
                        # A result put just before exiting may still be in the pipe: wait 2 s.
                        if now - exited_at.setdefault(r, now) > 2.0:
                            failures[r] = f"process exited with code {processes[r].exitcode} and no result"
                            pending.discard(r)
                if now > deadline:
                    why = "killed: another rank failed" if failures else f"did not finish within {timeout:g} s"
                    for r in pending:
                        failures[r] = why
                    pending.clear()
                continue
            pending.discard(rank)
            if ok:
                values[rank] = torch.load(io.BytesIO(value), weights_only=False)
            else:
                failures[rank] = value
                # The others may now wait on the failed rank in a collective: a few seconds to
                # report, then they are killed.
                deadline = min(deadline, time.monotonic() + 10.0)
    finally:
        for process in processes:
            process.join(timeout=max(0.0, min(5.0, deadline - time.monotonic())))
            if process.is_alive():
                process.kill()
                process.join()
    if failures:
        text = "\n".join(f"--- rank {rank}:\n{message}" for rank, message in sorted(failures.items()))
        raise RuntimeError(f"moe_routing.distributed.run_local: {len(failures)} of {world} processes failed:\n{text}")
    return [values[rank] for rank in range(world)]
