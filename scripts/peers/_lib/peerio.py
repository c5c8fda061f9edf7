"""What every peer of the workbench harness shares (protocol: harness/src/peer.rs): JSON-line
replies, safetensors case files read and written with the standard library alone (so a peer
whose real package is missing can still answer `unavailable`), and the request loop.
"""
import json
import struct
import sys

# safetensors dtype name -> (numpy dtype name, bytes per value)
DTYPES = {"F32": ("float32", 4), "F16": ("float16", 2), "BF16": ("bfloat16", 2), "U8": ("uint8", 1)}


def reply(**fields):
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def read_case(path):
    """{name: (dtype, shape, bytes)} of a safetensors file, and its string metadata."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    data = memoryview(raw)[8 + n :]
    meta = header.pop("__metadata__", {}) or {}
    out = {}
    for name, t in header.items():
        start, end = t["data_offsets"]
        out[name] = (t["dtype"], t["shape"], data[start:end])
    return out, meta


def write_case(path, tensors):
    """Writes {name: (dtype, shape, bytes)} as safetensors (little-endian, 8-byte aligned)."""
    header, body, offset = {}, [], 0
    for name, (dtype, shape, data) in tensors.items():
        data = bytes(data)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        body.append(data)
        offset += len(data)
    head = json.dumps(header).encode()
    head += b" " * ((8 - len(head) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head + b"".join(body))


def torch_tensor(entry, torch):
    """A case-file tensor as a torch tensor of its own dtype."""
    dtype, shape, data = entry
    kinds = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "U8": torch.uint8}
    return torch.frombuffer(bytearray(data), dtype=kinds[dtype]).reshape(shape).clone()


def write_torch_out(path, tensor):
    """Writes a torch tensor as f32 tensor `out`."""
    t = tensor.detach().to("cpu").float().contiguous()
    write_case(path, {"out": ("F32", list(t.shape), t.numpy().tobytes())})


def unavailable_forever(why):
    """Answers every request with `unavailable` (the peer's package is not importable)."""
    for _ in sys.stdin:
        reply(ok=False, unavailable=why)


def serve(handle):
    """The request loop: handle(op, request) returns the reply's fields (ok=True added), or
    raises Unsupported, or any other exception (an `error` reply; the harness goes on)."""
    for line in sys.stdin:
        try:
            req = json.loads(line)
            fields = handle(req.get("op"), req)
            reply(ok=True, **(fields or {}))
        except Unsupported as e:
            reply(ok=False, unsupported=str(e))
        except Unavailable as e:
            reply(ok=False, unavailable=str(e))
        except Exception as e:  # noqa: BLE001 - reported to the harness, which goes on
            reply(ok=False, error=f"{type(e).__name__}: {e}")


class Unsupported(Exception):
    """The peer cannot do this point."""


class Unavailable(Exception):
    """What the peer runs is not installed (the harness takes the peer down for the run)."""
