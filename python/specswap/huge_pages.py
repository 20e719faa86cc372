"""Large weight tensors on transparent huge pages (Linux).

A decode step streams every weight once. On 4 KiB pages that is a TLB miss every 4 KiB (two-level under a
hypervisor), and the hardware prefetchers stop at each page's edge. ``place_on_huge_pages`` copies each large
parameter and buffer (at least ``MIN_BYTES``) into a private anonymous mapping aligned to 2 MiB and advised
``MADV_HUGEPAGE``, which the kernel backs with huge pages where ``/sys/kernel/mm/transparent_hugepage/enabled``
is ``always`` or ``madvise`` (the usual default). Values, dtypes, shapes and ties are kept: tensors sharing one
storage (a tied embedding and LM head) share the new one. The Engine does it once for a CPU target and its
draft, before it measures costs or captures graphs (docs/gemma.md has the measured gain).

``SPECSWAP_HUGE_PAGES=off`` keeps the weights where they are. Where the kernel has no transparent huge pages
(mode ``never``, or not Linux) nothing moves and one warning says so.
"""

from __future__ import annotations

import logging
import mmap
import os
import weakref
from pathlib import Path

import torch

__all__ = ["HUGE_PAGE_BYTES", "MIN_BYTES", "ENV", "huge_pages_mode", "huge_page_copy", "place_on_huge_pages",
           "on_huge_pages"]

log = logging.getLogger(__name__)

HUGE_PAGE_BYTES = 2 << 20
MIN_BYTES = 1 << 20  # smaller tensors stay: they fit in cache, and each mapping rounds up to a huge page
ENV = "SPECSWAP_HUGE_PAGES"
MODE_FILE = Path("/sys/kernel/mm/transparent_hugepage/enabled")

# data pointer of a placed tensor -> a weak reference to the mapping it lives in. The tensor's storage holds the
# mapping (torch.frombuffer keeps its buffer), so the mapping is unmapped with the last tensor on it and its entry
# goes with it: an engine dropped gives its weights' memory back.
_mappings: dict[int, weakref.ref] = {}
_warned = False


def huge_pages_mode(mode_file: Path = MODE_FILE) -> str | None:
    """The kernel's transparent huge page mode ("always", "madvise" or "never"), None where there is none to
    read (not Linux, or Python's mmap without MADV_HUGEPAGE)."""
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return None
    try:
        text = mode_file.read_text()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else None


def on_huge_pages(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is one that place_on_huge_pages made (it then leaves it be)."""
    mapping = _mappings.get(tensor.data_ptr())
    return mapping is not None and mapping() is not None


def huge_page_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of a contiguous CPU tensor in a 2 MiB-aligned private mapping advised MADV_HUGEPAGE. The mapping
    lives as long as a tensor on it does."""
    if tensor.device.type != "cpu" or not tensor.is_contiguous():
        raise ValueError(f"huge_page_copy takes a contiguous CPU tensor, got one on {tensor.device} "
                         f"(contiguous: {tensor.is_contiguous()})")
    size = tensor.numel() * tensor.element_size()
    mapping = mmap.mmap(-1, size + HUGE_PAGE_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    mapping.madvise(mmap.MADV_HUGEPAGE)
    raw = torch.frombuffer(mapping, dtype=torch.uint8)
    start = -raw.data_ptr() % HUGE_PAGE_BYTES
    copy = raw[start:start + size].view(tensor.dtype).view(tensor.shape)
    copy.copy_(tensor)
    pointer = copy.data_ptr()
    _mappings[pointer] = weakref.ref(mapping)
    weakref.finalize(mapping, _forget, pointer, _mappings[pointer])
    return copy


def _forget(pointer: int, entry: weakref.ref) -> None:
    """Drop a released mapping's entry (unless a newer mapping at the same address replaced it)."""
    if _mappings.get(pointer) is entry:
        del _mappings[pointer]


def _movable(tensor: torch.Tensor | None, min_bytes: int) -> bool:
    """A CPU tensor of at least min_bytes that is its storage's whole extent (a view into a larger storage is
    left where it is: moving it alone would copy what it shares)."""
    if tensor is None or tensor.device.type != "cpu" or not tensor.is_contiguous() or on_huge_pages(tensor):
        return False
    size = tensor.numel() * tensor.element_size()
    return size >= min_bytes and tensor.storage_offset() == 0 and tensor.untyped_storage().nbytes() == size


def place_on_huge_pages(*modules: torch.nn.Module | None, min_bytes: int | None = None) -> int:
    """Move every parameter and buffer of ``modules`` (None entries skipped) of at least ``min_bytes`` (default
    ``MIN_BYTES``) onto huge pages, shared storages once. Returns the bytes moved (0 when off or unsupported;
    see the module docstring)."""
    global _warned
    min_bytes = MIN_BYTES if min_bytes is None else min_bytes
    if os.environ.get(ENV, "").strip().lower() in ("0", "off", "no", "false"):
        return 0
    mode = huge_pages_mode()
    if mode not in ("always", "madvise"):
        if not _warned:
            _warned = True
            log.warning("weights stay on 4 KiB pages: the kernel has no transparent huge pages (mode %s); "
                        "`echo madvise > %s` enables them (specswap.huge_pages)", mode, MODE_FILE)
        return 0
    # storage pointer -> its copy. An old storage is freed once its last holder points at the copy; its address
    # can come back only under a copy (skipped as placed), never under a tensor still waiting here, so the keys
    # stay unambiguous without keeping the old storages alive (peak memory: the weights plus one tensor).
    moved: dict[int, torch.Tensor] = {}
    total = 0
    for module in modules:
        if module is None:
            continue
        for owner in module.modules():
            for table in (owner._parameters, owner._buffers):
                for name, tensor in table.items():
                    if not _movable(tensor, min_bytes):
                        continue
                    key = tensor.untyped_storage().data_ptr()
                    if key not in moved:
                        moved[key] = huge_page_copy(tensor.detach())
                        total += moved[key].numel() * moved[key].element_size()
                    if isinstance(tensor, torch.nn.Parameter):
                        tensor.data = moved[key]
                    else:
                        table[name] = moved[key]
    if total:
        log.info("%.0f MiB of weights on transparent huge pages (mode %s)", total / 2**20, mode)
    return total
