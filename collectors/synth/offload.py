"""Activation offload to host memory (Megatron-Core's ``cpu_offloading_num_layers``).

Transformer Engine's CPU offload copies the tensors a layer keeps for its backward to host
memory on a side stream while the next layer's forward runs, and waits for the copy before
that next layer's forward ends (its staging buffer is reused); in the backward it reads a
layer's tensors back while the following layer's backward runs. Over the hardware's host
link (``[host_link]``: PCIe on x86 servers, NVLink-C2C to Grace on GB200/GB300; the rate is
the link's nominal rate x its efficiency, capped by the GPU's share of host memory
bandwidth, :attr:`~collectors.synth.hardware.HardwareConfig.host_bytes_per_ns`), a copy of
``B`` bytes takes ``B / rate``; the part of it that the neighbouring layer's compute does not
cover is exposed on the compute stream:

    forward:  max(0, B / rate - t_fwd),   backward: max(0, B / rate - t_bwd)

with ``t_fwd`` / ``t_bwd`` the compute-stream time of one layer's forward / backward (the
offloaded layers are alike, so a layer's own time stands for its neighbour's). The waits are
appended to the offloaded layer's forward and backward sequences (``offload.d2h.wait``,
``offload.h2d.wait``: MEMCPY ops on the compute stream, sized by the bytes moved). Memory:
the offloaded layers keep no activations on the GPU; two layers' worth of staging buffers
(one leaving, one arriving) stay (:func:`collectors.synth.memory.memory_per_stage`).
"""

from __future__ import annotations

from dataclasses import replace

from ..enums import OpKind
from ..errors import ConfigError
from .builder import LayerTemplate, OpTemplate

__all__ = ["offloaded", "offload_wait_ns", "offload_model_layers"]

_MEMCPY = int(OpKind.MEMCPY)


def _compute_ns(ops) -> int:
    return int(sum(o.dur_ns for o in ops if o.lane == "compute"))


def offload_wait_ns(nbytes: float, host_bytes_per_ns: float, overlap_ns: int) -> int:
    """Exposed time (ns) of copying ``nbytes`` over the host link beside ``overlap_ns`` of
    compute."""
    if nbytes <= 0:
        return 0
    return max(0, int(round(nbytes / host_bytes_per_ns)) - int(overlap_ns))


def offloaded(lt: LayerTemplate, nbytes: int, host_bytes_per_ns: float) -> LayerTemplate:
    """``lt`` with its activations (``nbytes`` per micro-batch) offloaded to the host: the
    exposed parts of the copy out (forward) and back (backward) as waits on the compute
    stream (none when the compute covers them)."""
    t_fwd = _compute_ns(lt.fwd)
    t_bwd = _compute_ns(lt.bwd) + _compute_ns(lt.wgrad)
    d2h = offload_wait_ns(nbytes, host_bytes_per_ns, t_fwd)
    h2d = offload_wait_ns(nbytes, host_bytes_per_ns, t_bwd)
    fwd, bwd = lt.fwd, lt.bwd
    if d2h:
        fwd = fwd + (OpTemplate("offload.d2h.wait", "compute", d2h, kind=_MEMCPY,
                                flops=0.0, bytes=int(nbytes)),)
    if h2d:
        bwd = bwd + (OpTemplate("offload.h2d.wait", "compute", h2d, kind=_MEMCPY,
                                flops=0.0, bytes=int(nbytes)),)
    return replace(lt, fwd=fwd, bwd=bwd)


def offload_model_layers(model, hw, parallel, layers: tuple[LayerTemplate, ...]
                         ) -> tuple[LayerTemplate, ...]:
    """``layers`` (one template per transformer layer) with the first
    ``parallel.offload_layers`` offloaded (:func:`offloaded`, each with its own activation
    bytes, :func:`collectors.synth.memory.layer_activation_bytes`)."""
    from .memory import layer_activation_bytes

    n, L = parallel.offload_layers, len(layers)
    if n >= L:
        raise ConfigError(f"offload_layers={n}: must be fewer than the model's {L} layers "
                          f"(Megatron-Core's cpu_offloading_num_layers); choose 0 to {L - 1}")
    return tuple(offloaded(lt, layer_activation_bytes(model, parallel, layer=i),
                           hw.host_bytes_per_ns) if i < n else lt
                 for i, lt in enumerate(layers))
