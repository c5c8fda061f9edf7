"""How the torch peers time a call, the way the harness times its own kernels
(kernels/cuda/src/runtime.rs; protocol: harness/src/peer.rs):

- on a CUDA device, one untimed warm-up call, then each repetition between two CUDA events
  with L2 flushed before it, outside the events: a uint8 tensor of twice the L2
  (`L2_cache_size`, else the H200's 50 MiB), allocated once, `.zero_()`-ed. The request's
  `"l2": "hot"` leaves the flush out (the reply then says `"l2": "hot"`);
- on the CPU, each call by time.perf_counter (the harness evicts the host's caches before
  each request).
"""
import time

FALLBACK_L2_BYTES = 50 << 20


def flush_bytes(l2_bytes):
    """Bytes of the flush buffer for an L2 of `l2_bytes` (0 or None: the H200's assumed)."""
    return 2 * (l2_bytes if l2_bytes and l2_bytes > 0 else FALLBACK_L2_BYTES)


class Timer:
    """Times `call` on `device` per the harness's `time` request; one per peer process, which
    runs on one device (the flush buffer is allocated at its first cold CUDA timing and
    kept)."""

    def __init__(self, torch):
        self.torch = torch
        self.scratch = None

    def _flush_buffer(self, device):
        torch = self.torch
        if self.scratch is None:
            l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)
            self.scratch = torch.empty(flush_bytes(l2), dtype=torch.uint8, device=device)
        return self.scratch

    def time(self, call, device, req):
        """The reply to a `time` request: `times_ms`, and `l2` on a CUDA device."""
        torch = self.torch
        reps = int(req.get("reps", 1))
        if device.type != "cuda":
            times = []
            for _ in range(reps):
                t0 = time.perf_counter()
                call()
                times.append((time.perf_counter() - t0) * 1e3)
            return {"times_ms": times}
        hot = req.get("l2") == "hot"
        times = []
        with torch.cuda.device(device):
            scratch = None if hot else self._flush_buffer(device)
            call()
            torch.cuda.synchronize(device)
            for _ in range(reps):
                if scratch is not None:
                    scratch.zero_()
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                call()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
        return {"times_ms": times, "l2": "hot" if hot else "cold"}
