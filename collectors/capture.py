"""Capture real training runs with ``torch.profiler``: one Kineto trace per rank.

Two ways to use it:

1. In your own training loop (explicit)::

       from retime.collectors.capture import Capture

       with Capture("traces/run1", wait=1, warmup=1, active=3) as cap:
           for batch in loader:
               loss = model(batch).sum(); loss.backward(); opt.step(); opt.zero_grad()
               cap.step()            # marks the end of one training step

   then ``retime ingest traces/run1 -o run1.retime``.

2. Without touching the script: ``retime capture -n 2 -o traces/run1 -- train.py ARGS``
   launches the script under ``torchrun`` with capture enabled through ``RETIME_CAPTURE_*``
   environment variables; steps are counted at every ``optimizer.step()`` (a global
   optimizer post-hook). If the script itself opens a :class:`Capture`, that one takes over
   (the automatic one is discarded before it records anything it would write).

Schedule (the ``torch.profiler.schedule`` semantics): ``skip_first`` steps are ignored, then
each cycle has ``wait`` idle steps, ``warmup`` steps where the profiler runs but discards
(its start-up cost stays out of the trace) and ``active`` recorded steps; ``repeat`` cycles
(0 = until the loop ends). With ``repeat=1`` the traces are ``OUT/rank-<R>.pt.trace.json.gz``;
otherwise each cycle gets a folder ``OUT/cycle-<k>/`` so each folder ingests as one run.

Every trace carries what retime's Kineto reader needs: ``distributedInfo`` (backend, rank,
world size, ``pg_config`` with each process group's ranks — filled in from
``torch.distributed`` or the launcher's ``RANK``/``WORLD_SIZE`` when the profiler did not
write it), input shapes (``record_shapes=True``) so collectives have sizes, and a
``retimeCapture`` block (schedule, captured step numbers, host, pid, torch version, device).

``torch`` is imported lazily: the rest of ``collectors`` works without it, and using capture
without it raises a :class:`RetimeError` naming the ``retime[torch]`` extra.
"""

from __future__ import annotations

import atexit
import contextlib
import gzip
import os
import socket
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson

from .errors import ConfigError, RetimeError

__all__ = ["CaptureConfig", "Capture", "capture", "trace_path", "end_process", "ENV_PREFIX"]

#: prefix of the environment variables that ``retime capture`` sets for the child processes
ENV_PREFIX = "RETIME_CAPTURE_"
CAPTURE_FORMAT_VERSION = 1

_INT_FIELDS = ("wait", "warmup", "active", "repeat", "skip_first")
_BOOL_FIELDS = ("record_shapes", "profile_memory", "with_stack", "with_flops")


def _import_torch():
    try:
        import torch
        import torch.profiler  # noqa: F401
    except ImportError as exc:  # pragma: no cover - exercised only without torch
        raise RetimeError(
            f"capture needs PyTorch, which is not importable here ({exc}); install it with "
            '`pip install "retime[torch]"`') from exc
    return torch


def _env_bool(name: str, value: str) -> bool:
    v = value.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"environment variable {name}={value!r} is not a boolean; use 1 or 0")


@dataclass(frozen=True)
class CaptureConfig:
    """What to profile and where to write it.

    Parameters
    ----------
    out_dir : str
        Folder for the traces (created if missing). One file per rank per cycle.
    wait, warmup, active, repeat, skip_first : int
        The ``torch.profiler.schedule`` of steps (see the module docstring). ``active >= 1``.
    record_shapes : bool
        Record input shapes; retime needs them for collective sizes (keep True).
    profile_memory, with_stack, with_flops : bool
        Passed to ``torch.profiler.profile``. ``with_flops`` gives GEMM/conv FLOP counts.
    cuda : bool or None
        Profile CUDA activity; ``None`` means "if ``torch.cuda.is_available()``".
    compress : bool
        Write ``.json.gz`` (default) instead of ``.json``.
    """

    out_dir: str
    wait: int = 1
    warmup: int = 1
    active: int = 3
    repeat: int = 1
    skip_first: int = 0
    record_shapes: bool = True
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = True
    cuda: bool | None = None
    compress: bool = True

    def __post_init__(self) -> None:
        if not str(self.out_dir):
            raise ConfigError("capture out_dir is empty; pass a folder for the traces")
        for name in _INT_FIELDS:
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ConfigError(f"capture {name}={v!r} must be an integer >= 0")
        if self.active < 1:
            raise ConfigError(f"capture active={self.active} must be >= 1 (the steps recorded)")

    @property
    def steps_needed(self) -> int:
        """Steps the loop must run for the first cycle to complete."""
        return self.skip_first + self.wait + self.warmup + self.active

    def to_env(self) -> dict[str, str]:
        """Environment variables that make :meth:`from_env` rebuild this config."""
        env = {}
        for k, v in asdict(self).items():
            if v is None:
                continue
            env[ENV_PREFIX + k.upper()] = ("1" if v else "0") if isinstance(v, bool) else str(v)
        return env

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides: Any) -> CaptureConfig | None:
        """Config from ``RETIME_CAPTURE_*`` variables; ``None`` when ``..._OUT_DIR`` is unset.

        ``overrides`` that are not ``None`` win over the environment.
        """
        env = os.environ if environ is None else environ
        kw: dict[str, Any] = {}
        for name in ("out_dir", *_INT_FIELDS, *_BOOL_FIELDS, "cuda", "compress"):
            key = ENV_PREFIX + name.upper()
            if key not in env:
                continue
            raw = env[key]
            if name == "out_dir":
                kw[name] = raw
            elif name in _INT_FIELDS:
                try:
                    kw[name] = int(raw)
                except ValueError:
                    raise ConfigError(f"environment variable {key}={raw!r} is not an integer") from None
            else:
                kw[name] = _env_bool(key, raw)
        kw.update({k: v for k, v in overrides.items() if v is not None})
        if not kw.get("out_dir"):
            return None
        return cls(**kw)


def trace_path(out_dir: str | os.PathLike[str], rank: int, cycle: int, repeat: int,
               compress: bool = True) -> Path:
    """Where rank ``rank``'s trace of cycle ``cycle`` (0-based) goes (see module docstring)."""
    base = Path(out_dir) if repeat == 1 else Path(out_dir) / f"cycle-{cycle}"
    return base / f"rank-{rank}.pt.trace.json{'.gz' if compress else ''}"


def _dist_state(torch) -> dict[str, Any]:
    """Rank, world size, backend and process groups, from torch.distributed or the env."""
    info: dict[str, Any] = {}
    dist = getattr(torch, "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized():
        info["backend"] = str(dist.get_backend())
        info["rank"] = int(dist.get_rank())
        info["world_size"] = int(dist.get_world_size())
        try:
            info["pg_count"] = int(dist.get_pg_count())
            info["pg_config"] = dist.distributed_c10d._get_all_pg_configs()
        except Exception:  # private API: fall back to the default group below
            pass
    else:
        info["rank"] = int(os.environ.get("RANK", 0))
        info["world_size"] = int(os.environ.get("WORLD_SIZE", 1))
    if "pg_config" not in info:
        ws = info["world_size"]
        info["pg_count"] = 1
        info["pg_config"] = [{"pg_name": "0", "pg_desc": "default_pg",
                              "backend_config": info.get("backend", "undefined"),
                              "pg_size": ws, "ranks": list(range(ws))}]
    return info


@contextlib.contextmanager
def _quiet_cycles():
    """Silence torch's notice that events are cleared between cycles: we write each cycle
    to its own file, so that is the behaviour we want (and not the user's concern)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Warning: Profiler clears events at the end")
        yield


def _load_export(raw: bytes) -> tuple[dict, dict[str, int]]:
    """The profiler's exported JSON, and what had to be repaired in it (empty when nothing).

    torch's exporter sometimes writes a string with bytes it never initialized (seen with
    torch 2.13 on loopback gloo jobs: a raw control character): the capture must not kill
    the training job over a name. Invalid UTF-8 is replaced (U+FFFD), raw control
    characters inside strings are escaped, and both are counted in ``retimeCapture.repaired``.
    """
    try:
        return orjson.loads(raw), {}
    except orjson.JSONDecodeError:
        pass
    from .kineto.events import escape_control_chars

    repaired: dict[str, int] = {}
    text = raw.decode("utf-8", "replace")
    bad = text.count("\ufffd") - raw.decode("utf-8", "ignore").count("\ufffd")
    if bad:
        repaired["invalid_utf8_replaced"] = bad
        raw = text.encode("utf-8")
    raw, n = escape_control_chars(raw)
    if n:
        repaired["control_chars_escaped"] = n
    return orjson.loads(raw), repaired


class Capture:
    """Profile chosen steps of a training loop; write one Kineto trace per rank.

    Use as a context manager and call :meth:`step` once at the end of every training step.
    With no ``out_dir`` and no ``RETIME_CAPTURE_OUT_DIR`` in the environment the capture is
    disabled (``enabled`` is False and :meth:`step` does nothing), so a script can keep the
    hook in and profile only when launched by ``retime capture``. Keyword arguments left at
    ``None`` take their value from ``RETIME_CAPTURE_*`` variables, then the defaults of
    :class:`CaptureConfig`.

    Attributes
    ----------
    paths : list of Path
        Trace files written so far (one per completed cycle on this rank).
    steps : int
        Calls to :meth:`step` so far.
    """

    def __init__(self, out_dir: str | os.PathLike[str] | None = None, *,
                 wait: int | None = None, warmup: int | None = None, active: int | None = None,
                 repeat: int | None = None, skip_first: int | None = None,
                 record_shapes: bool | None = None, profile_memory: bool | None = None,
                 with_stack: bool | None = None, with_flops: bool | None = None,
                 cuda: bool | None = None, compress: bool | None = None,
                 config: CaptureConfig | None = None,
                 metadata: dict[str, Any] | None = None) -> None:
        if config is None:
            config = CaptureConfig.from_env(
                out_dir=None if out_dir is None else str(out_dir), wait=wait, warmup=warmup,
                active=active, repeat=repeat, skip_first=skip_first, record_shapes=record_shapes,
                profile_memory=profile_memory, with_stack=with_stack, with_flops=with_flops,
                cuda=cuda, compress=compress)
        self.config = config
        # written into every trace's retimeCapture block; what-ifs read "ddp_param_bytes"
        # ([p.numel() * p.element_size() for p in model.parameters()]) for re-bucketing
        self.metadata: dict[str, Any] = dict(metadata or {})
        self.paths: list[Path] = []
        self.steps = 0
        self._prof = None
        self._cycle = 0
        self._discard = False
        self._use_cuda = False

    @property
    def enabled(self) -> bool:
        return self.config is not None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> Capture:
        """Start profiling (what ``__enter__`` does)."""
        if not self.enabled or self._prof is not None:
            return self
        if self is not _AUTO.get("capture"):
            _cancel_auto()  # an explicit Capture in the script takes over from `retime capture`
        torch = _import_torch()
        cfg = self.config
        Path(cfg.out_dir).mkdir(parents=True, exist_ok=True)
        acts = [torch.profiler.ProfilerActivity.CPU]
        use_cuda = torch.cuda.is_available() if cfg.cuda is None else cfg.cuda
        if use_cuda:
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        sched = torch.profiler.schedule(wait=cfg.wait, warmup=cfg.warmup, active=cfg.active,
                                        repeat=cfg.repeat, skip_first=cfg.skip_first)
        self._prof = torch.profiler.profile(
            activities=acts, schedule=sched, on_trace_ready=self._on_trace_ready,
            record_shapes=cfg.record_shapes, profile_memory=cfg.profile_memory,
            with_stack=cfg.with_stack, with_flops=cfg.with_flops)
        self._use_cuda = bool(use_cuda)
        with _quiet_cycles():
            self._prof.start()
        return self

    def step(self) -> None:
        """Mark the end of one training step."""
        if self._prof is None:
            return
        self.steps += 1
        with _quiet_cycles():
            self._prof.step()

    def stop(self) -> None:
        """Stop profiling; a cycle cut short by the end of the loop is written as it is."""
        self._stop()

    def _stop(self, warn: bool = True) -> None:
        if self._prof is None:
            return
        prof, self._prof = self._prof, None
        with _quiet_cycles():
            prof.stop()
        if warn and not self.paths and not self._discard:
            warnings.warn(
                f"retime capture wrote no trace: the loop ran {self.steps} step(s) but the "
                f"schedule records from step {self.config.steps_needed - self.config.active + 1} "
                f"(skip_first={self.config.skip_first}, wait={self.config.wait}, "
                f"warmup={self.config.warmup}); run more steps or lower wait/warmup, and call "
                "cap.step() once per step", RuntimeWarning, stacklevel=3)

    def __enter__(self) -> Capture:
        return self.start()

    def __exit__(self, exc_type: object, *exc: object) -> None:
        # an exception from the loop is the news; don't bury it under "no trace written"
        self._stop(warn=exc_type is None)

    # -- writing -----------------------------------------------------------------------------
    def _on_trace_ready(self, prof) -> None:
        if self._discard:
            return
        torch = _import_torch()
        cfg = self.config
        state = _dist_state(torch)
        rank = int(state["rank"])
        out = trace_path(cfg.out_dir, rank, self._cycle, cfg.repeat, cfg.compress)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp_json = out.parent / f".{out.name}.{os.getpid()}.tmp.json"
        prof.export_chrome_trace(str(tmp_json))
        try:
            raw = tmp_json.read_bytes()
        finally:
            tmp_json.unlink(missing_ok=True)
        doc, repaired = _load_export(raw)
        self._annotate(doc, state, torch)
        if repaired:
            doc["retimeCapture"]["repaired"] = repaired
        tmp = out.parent / f".{out.name}.{os.getpid()}.tmp"
        data = orjson.dumps(doc)
        if cfg.compress:
            with gzip.open(tmp, "wb", compresslevel=3) as fh:
                fh.write(data)
        else:
            tmp.write_bytes(data)
        os.replace(tmp, out)
        self.paths.append(out)
        self._cycle += 1

    def _annotate(self, doc: dict, state: dict, torch) -> None:
        cfg = self.config
        di = doc.get("distributedInfo")
        if not isinstance(di, dict):
            di = {}
        # Fill, never overwrite, what the profiler itself recorded.
        for k in ("backend", "rank", "world_size", "pg_count", "pg_config"):
            if k in state and k not in di:
                di[k] = state[k]
        doc["distributedInfo"] = di
        # ProfilerStep#N ranges give the recorded step numbers (0-based, as torch counts).
        steps = sorted({int(e["name"].split("#", 1)[1]) for e in doc.get("traceEvents", ())
                        if isinstance(e, dict) and str(e.get("name", "")).startswith("ProfilerStep#")
                        and e["name"].split("#", 1)[1].isdigit()})
        doc["retimeCapture"] = {
            "version": CAPTURE_FORMAT_VERSION,
            "rank": int(state["rank"]),
            "world_size": int(state["world_size"]),
            "local_rank": int(os.environ.get("LOCAL_RANK", state["rank"])),
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            # the CPUs this rank could run on: ranks of one host whose sets overlap share
            # those cores (what-ifs that add ranks to a host use it)
            "cpu_affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else list(range(os.cpu_count() or 1)),
            "metadata": dict(self.metadata),
            "cycle": self._cycle,
            "steps_recorded": steps,
            "schedule": {k: getattr(cfg, k) for k in _INT_FIELDS},
            "record_shapes": cfg.record_shapes,
            "device": "cuda" if self._use_cuda else "cpu",
            "torch_version": str(torch.__version__),
            "written_unix_ns": time.time_ns(),
        }


def capture(out_dir: str | os.PathLike[str] | None = None, **kwargs: Any) -> Capture:
    """Same as :class:`Capture` (reads better in ``with capture("out") as cap:``)."""
    return Capture(out_dir, **kwargs)


# -- automatic capture under `retime capture` ------------------------------------------------
_AUTO: dict[str, Any] = {}


def _cancel_auto() -> None:
    cap = _AUTO.pop("capture", None)
    handle = _AUTO.pop("hook", None)
    if handle is not None:
        handle.remove()
    if cap is not None:
        cap._discard = True
        cap.stop()


def install_auto_capture(config: CaptureConfig) -> Capture:
    """Start a capture that counts a step at every ``optimizer.step()`` of any optimizer.

    Used by ``retime capture`` for scripts that do not call :class:`Capture` themselves.
    The profiler stops at interpreter exit (a cycle cut short is written as it is).
    """
    torch = _import_torch()
    from torch.optim.optimizer import register_optimizer_step_post_hook

    _cancel_auto()
    cap = Capture(config=config)
    _AUTO["capture"] = cap
    cap.start()
    _AUTO["hook"] = register_optimizer_step_post_hook(lambda opt, args, kwargs: cap.step())
    atexit.register(_finish_auto)
    del torch
    return cap


def _finish_auto(warn: bool = True) -> None:
    cap = _AUTO.pop("capture", None)
    handle = _AUTO.pop("hook", None)
    if handle is not None:
        handle.remove()
    if cap is not None:
        cap._stop(warn=warn)


def end_process(code: int = 0) -> None:
    """End a training process cleanly once its traces are written: destroy the process
    group, flush output, and leave without running C++ static destructors.

    gloo workers on torch 2.x sometimes abort at interpreter exit after a complete run
    ("terminate called without an active exception", SIGABRT) while torch's globals are torn
    down; leaving through ``os._exit`` after an orderly shutdown avoids it. Call it last in
    a rank's process (the traces are already on disk: :class:`Capture` writes them when its
    profiling cycle ends or its ``with`` block closes).
    """
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # noqa: BLE001 - leaving anyway; nothing to clean up beyond this
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _main(argv: list[str] | None = None) -> int:
    """``python -m retime.collectors.capture [-m MODULE | SCRIPT] ARGS``: run a script with capture.

    The child entry point of ``retime capture`` (run by torchrun once per rank). Capture is
    configured by ``RETIME_CAPTURE_*``; ``RETIME_CAPTURE_AUTO=0`` leaves step marking to an
    explicit :class:`Capture` in the script.
    """
    import runpy

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        raise ConfigError("usage: python -m retime.collectors.capture [-m MODULE | SCRIPT] [ARGS...]")
    cfg = CaptureConfig.from_env()
    if cfg is None:
        raise ConfigError(f"{ENV_PREFIX}OUT_DIR is not set; run through `retime capture -o DIR -- SCRIPT`")
    if argv[0] == "-m":
        if len(argv) < 2:
            raise ConfigError("`-m` needs a module name")
        module, script = argv[1], None
        sys.argv = [module, *argv[2:]]
    else:
        module, script = None, Path(argv[0])
        if not script.is_file():
            raise ConfigError(f"{script}: no such script; pass the training script's path")
        sys.argv = [str(script), *argv[1:]]
        sys.path.insert(0, str(script.resolve().parent))
    if _env_bool(ENV_PREFIX + "AUTO", os.environ.get(ENV_PREFIX + "AUTO", "1")):
        install_auto_capture(cfg)
    try:
        if module is not None:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:  # sys.exit() at the end of a script is a normal end
        _finish_auto(warn=exc.code in (0, None))
        raise
    except BaseException:
        _finish_auto(warn=False)  # the script's own error is the news
        raise
    _finish_auto()
    return 0


if __name__ == "__main__":
    # Run through the imported module so that state is shared with `import retime.collectors.capture`
    # inside the user's script (runpy would otherwise make a second copy of this module).
    from retime.collectors.capture import _main as _real_main
    from retime.collectors.capture import end_process as _end

    try:
        _code = _real_main()
    except RetimeError as _exc:
        print(f"retime capture: error: {_exc}", file=sys.stderr)
        _code = 2
    except SystemExit as _exc:  # the script's own sys.exit(): keep its code
        _code = _exc.code if isinstance(_exc.code, int) else (0 if _exc.code is None else 1)
    _end(_code)

