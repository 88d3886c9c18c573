"""The JSON header of a safetensors file, read with checks (no torch: the vLLM plugin's config
parsing and qhead.torch share it)."""
from __future__ import annotations

import json
import os
import struct
from typing import Tuple

import qhead


def safetensors_header(path: str) -> Tuple[dict, int]:
    """The JSON header of a safetensors file and the byte offset where its data begins."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise qhead.InvalidFileError(f"{path}: not a safetensors file (shorter than 8 bytes)")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8:
                raise qhead.InvalidFileError(f"{path}: safetensors header length {n} exceeds the file size {size}")
            header = json.loads(f.read(n))
    except OSError as e:
        raise qhead.IoError(f"{path}: {e.strerror or e}") from e
    except (ValueError, UnicodeDecodeError) as e:
        raise qhead.InvalidFileError(f"{path}: safetensors header is not valid JSON ({e})") from e
    if not isinstance(header, dict):
        raise qhead.InvalidFileError(f"{path}: safetensors header is not a JSON object")
    return header, 8 + n
