"""Starting and running small torch.distributed jobs (tests, benchmarks): free port, multicast-off environment,
process-group set-up and a spawn helper with a hard timeout.

Everything here is plain ``torch.distributed`` (NCCL on GPUs, gloo on the CPU); nothing is home-made
communication. NVLink multicast stays off in every process started from here (:data:`MULTICAST_OFF_ENV`): on the
shared multi-GPU hosts a program that uses it can take the GPUs out of service, so it is set before torch creates a
communicator, in the parent and again in every child.
"""
from __future__ import annotations

import datetime
import os
import pickle
import queue as _queue
import socket
import traceback
from typing import Any, Callable

import torch
import torch.distributed as dist

__all__ = ["MULTICAST_OFF_ENV", "set_multicast_off", "free_port", "init_distributed", "shutdown_distributed",
           "spawn_distributed", "DistributedRunError"]

MULTICAST_OFF_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
"""Environment that keeps NVLink multicast (NVLS) off in NCCL, PyTorch symmetric memory and NVSHMEM."""


class DistributedRunError(RuntimeError):
    """A rank of :func:`spawn_distributed` raised, exited abnormally, or the job ran past its timeout."""


def set_multicast_off() -> None:
    """Force :data:`MULTICAST_OFF_ENV` into ``os.environ`` (overriding any other value)."""
    os.environ.update(MULTICAST_OFF_ENV)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0 and read the number back)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(rank: int | None = None, world_size: int | None = None, backend: str | None = None,
                     port: int | None = None, timeout_s: float = 120.0) -> tuple[int, int, torch.device]:
    """Join (or create) the default process group and return ``(rank, world_size, device)``.

    With ``rank``/``world_size``/``port`` None they are read from the torchrun environment (``RANK``,
    ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT``, ``LOCAL_RANK``). ``backend``: ``"nccl"`` (sets the CUDA device
    to ``cuda:LOCAL_RANK``), ``"gloo"`` (CPU tensors), or None = nccl when CUDA is available, else gloo.
    ``timeout_s`` bounds every collective, so a peer that died cannot hang the others forever.
    Multicast is switched off first (:func:`set_multicast_off`).
    Raises ValueError for an unknown backend, or RuntimeError (from torch) when the rendezvous fails.
    """
    set_multicast_off()
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend not in ("nccl", "gloo"):
        raise ValueError(f"backend must be 'nccl' or 'gloo', got {backend!r}")
    rank = int(os.environ.get("RANK", 0)) if rank is None else rank
    world_size = int(os.environ.get("WORLD_SIZE", 1)) if world_size is None else world_size
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if port is None:
        addr, port_s = os.environ.get("MASTER_ADDR", "127.0.0.1"), os.environ.get("MASTER_PORT")
        if port_s is None:
            raise ValueError("no port given and MASTER_PORT is not set (start under torchrun or pass port=)")
        init_method = f"tcp://{addr}:{port_s}"
    else:
        init_method = f"tcp://127.0.0.1:{port}"
    kw: dict[str, Any] = {}
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        kw["device_id"] = device
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_s), **kw)
    return rank, world_size, device


def shutdown_distributed() -> None:
    """Destroy the default process group if one exists (safe to call twice)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _worker(rank: int, world_size: int, port: int, backend: str, timeout_s: float, fn, args, results) -> None:
    try:
        torch.set_num_threads(1)
        init_distributed(rank, world_size, backend, port, timeout_s)
        out = fn(rank, world_size, *args)
        # plain pickle bytes, not torch's shared-memory reduction: this process may exit before the parent reads
        results.put((rank, True, pickle.dumps(out)))
    except BaseException:  # report everything (assertion, NCCL error, KeyboardInterrupt) to the parent
        results.put((rank, False, traceback.format_exc()))
    finally:
        try:
            shutdown_distributed()
        except Exception:
            pass


def spawn_distributed(fn: Callable[..., Any], world_size: int = 2, args: tuple = (), backend: str = "gloo",
                      timeout_s: float = 60.0) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` fresh processes joined in one process group.

    ``fn`` must be a module-level function (the processes are started with the ``spawn`` method) and return a
    picklable value (CPU tensors are fine: results travel as pickled bytes). The port is a free one (:func:`free_port`); multicast is off in every child.
    Returns the per-rank results, index = rank. Every process is joined; one still alive after ``timeout_s`` (a
    hang: a peer died inside a collective, a deadlock) is terminated, then killed.
    Raises DistributedRunError naming the rank, with its traceback, if any rank failed or timed out; ValueError for
    ``world_size < 1``.
    """
    import torch.multiprocessing as mp

    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    set_multicast_off()
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, world_size, port, backend, timeout_s, fn, args, results),
                         daemon=True) for r in range(world_size)]
    for p in procs:
        p.start()
    got: dict[int, tuple[bool, Any]] = {}
    deadline = datetime.datetime.now() + datetime.timedelta(seconds=timeout_s)
    try:
        while len(got) < world_size:
            left = (deadline - datetime.datetime.now()).total_seconds()
            if left <= 0:
                break
            try:
                r, ok, out = results.get(timeout=min(left, 1.0))
                got[r] = (ok, out)
            except _queue.Empty:
                if all(not p.is_alive() for p in procs) and results.empty():
                    break
    finally:
        for p in procs:
            p.join(timeout=max(0.0, min(10.0, (deadline - datetime.datetime.now()).total_seconds() + 5)))
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    errors = [f"rank {r}:\n{out}" for r, (ok, out) in sorted(got.items()) if not ok]
    missing = [r for r in range(world_size) if r not in got]
    if missing:
        codes = {r: procs[r].exitcode for r in missing}
        errors.append(f"ranks {missing} returned nothing within {timeout_s:.0f} s (exit codes {codes})")
    if errors:
        raise DistributedRunError("distributed run failed:\n" + "\n".join(errors))
    return [pickle.loads(got[r][1]) for r in range(world_size)]
