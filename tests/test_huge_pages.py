"""Weights on transparent huge pages (specswap.huge_pages): large tensors move into 2 MiB-aligned mappings
advised MADV_HUGEPAGE with their values, shapes and ties kept; small ones stay; nothing moves when switched off
or where the kernel has no huge pages (one warning); an Engine's tokens do not change."""

import logging
import mmap
import sys

import pytest
import torch
from torch import nn

from specswap import huge_pages

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="transparent huge pages are Linux's")


def vm_flags(address: int) -> list[str]:
    """The VmFlags of the mapping of this process that holds ``address`` (/proc/self/smaps)."""
    inside = False
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            start, end = (int(part, 16) for part in head.split("-"))
            inside = start <= address < end
        elif inside and head == "VmFlags:":
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(512, 256)   # 512 KiB
        self.head = nn.Linear(256, 512, bias=False)
        self.head.weight = self.embed.weight  # tied, as Gemma's LM head
        self.register_buffer("blocks", torch.arange(300_000, dtype=torch.int32))  # 1.1 MiB
        self.small = nn.Linear(4, 4)


@pytest.fixture()
def thp(monkeypatch):
    """The kernel's mode pinned to madvise and the warning re-armed (the test decides what the kernel says)."""
    monkeypatch.setattr(huge_pages, "huge_pages_mode", lambda: "madvise")
    monkeypatch.setattr(huge_pages, "_warned", False)
    monkeypatch.delenv(huge_pages.ENV, raising=False)


def test_mode_is_read_from_the_kernel_file(tmp_path):
    mode = tmp_path / "enabled"
    mode.write_text("always [madvise] never\n")
    assert huge_pages.huge_pages_mode(mode) == "madvise"
    mode.write_text("[never]\n")
    assert huge_pages.huge_pages_mode(mode) == "never"
    assert huge_pages.huge_pages_mode(tmp_path / "absent") is None


def test_large_tensors_move_with_values_and_ties_kept(thp):
    module = Tied()
    before = {name: t.detach().clone() for name, t in module.state_dict().items()}
    small = module.small.weight.data_ptr()
    moved = huge_pages.place_on_huge_pages(module, None, min_bytes=256 * 1024)
    embed, blocks = module.embed.weight, module.blocks
    assert moved == embed.numel() * 4 + blocks.numel() * 4  # the tied weight counted once
    assert module.head.weight is embed and module.head.weight.data_ptr() == embed.data_ptr()
    assert isinstance(embed, nn.Parameter) and embed.requires_grad
    for tensor in (embed, blocks):
        assert huge_pages.on_huge_pages(tensor)
        assert tensor.data_ptr() % huge_pages.HUGE_PAGE_BYTES == 0
        assert "hg" in vm_flags(tensor.data_ptr())  # advised MADV_HUGEPAGE
    assert module.small.weight.data_ptr() == small and not huge_pages.on_huge_pages(module.small.weight)
    after = module.state_dict()
    assert all(torch.equal(after[name], value) and after[name].dtype == value.dtype for name, value in before.items())
    assert huge_pages.place_on_huge_pages(module, min_bytes=256 * 1024) == 0  # already there


def test_buffers_shared_between_modules_stay_shared(thp):
    shared = torch.ones(2 << 20, dtype=torch.uint8)
    first, second = nn.Module(), nn.Module()
    first.register_buffer("w", shared)
    second.register_buffer("w", shared)
    assert huge_pages.place_on_huge_pages(first, second) == shared.numel()
    assert first.w.data_ptr() == second.w.data_ptr() != shared.data_ptr()
    assert huge_pages.on_huge_pages(first.w) and torch.equal(first.w, shared)


def test_a_view_into_a_larger_storage_stays(thp):
    module = nn.Module()
    whole = torch.zeros(4 << 20, dtype=torch.uint8)
    module.register_buffer("front", whole[: 2 << 20])
    assert huge_pages.place_on_huge_pages(module) == 0
    assert module.front.data_ptr() == whole.data_ptr()


def test_nothing_moves_when_off_or_unsupported(thp, monkeypatch, caplog):
    module = Tied()
    pointer = module.blocks.data_ptr()
    monkeypatch.setenv(huge_pages.ENV, "off")
    assert huge_pages.place_on_huge_pages(module) == 0
    monkeypatch.delenv(huge_pages.ENV)
    monkeypatch.setattr(huge_pages, "huge_pages_mode", lambda: "never")
    with caplog.at_level(logging.WARNING, logger=huge_pages.__name__):
        assert huge_pages.place_on_huge_pages(module) == 0
        assert huge_pages.place_on_huge_pages(module) == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "no transparent huge pages (mode never)" in warnings[0]
    assert module.blocks.data_ptr() == pointer


def test_huge_page_copy_refuses_what_it_cannot_copy():
    with pytest.raises(ValueError, match="contiguous CPU tensor"):
        huge_pages.huge_page_copy(torch.zeros(4, 4).t())
    assert hasattr(mmap, "MADV_HUGEPAGE")  # Linux's Python has it: huge_pages_mode can only say None elsewhere


def test_engine_places_its_weights_and_its_tokens_do_not_change(thp, monkeypatch):
    from specswap import Engine
    texts = ["def fibonacci(n):\n    ", "The purpose of this module is"]
    monkeypatch.setenv(huge_pages.ENV, "off")
    kept = Engine("tiny", speculative_algorithm="EAGLE", dtype="float32", max_seq_len=128)
    monkeypatch.delenv(huge_pages.ENV)
    monkeypatch.setattr(huge_pages, "MIN_BYTES", 64 * 1024)  # the tiny pair's matrices are small
    placed = Engine("tiny", speculative_algorithm="EAGLE", dtype="float32", max_seq_len=128)
    assert not any(huge_pages.on_huge_pages(t) for t in kept.target.state_dict().values())
    assert any(huge_pages.on_huge_pages(t) for t in placed.target.state_dict().values())
    assert any(huge_pages.on_huge_pages(t) for t in placed.draft.state_dict().values())
    assert [r.token_ids for r in placed.generate(texts, 24)] == [r.token_ids for r in kept.generate(texts, 24)]


def test_each_old_tensor_is_freed_before_the_next_is_copied(thp, monkeypatch):
    """Peak memory is the weights plus one tensor, not twice the weights (a model near the machine's memory)."""
    import weakref
    module = nn.Module()
    module.register_buffer("first", torch.ones(1 << 20, dtype=torch.uint8))
    module.register_buffer("second", torch.ones(1 << 20, dtype=torch.uint8))
    old_first = weakref.ref(module.first)
    alive_at_second_copy = []
    copy = huge_pages.huge_page_copy

    def watching(tensor):
        if len(alive_at_second_copy) == 0 and tensor.data_ptr() != module._buffers["first"].data_ptr():
            alive_at_second_copy.append(old_first() is not None)
        return copy(tensor)

    monkeypatch.setattr(huge_pages, "huge_page_copy", watching)
    assert huge_pages.place_on_huge_pages(module) == 2 << 20
    assert alive_at_second_copy == [False]


def test_the_mapping_is_released_with_the_last_tensor_on_it(thp):
    """An engine dropped gives its weights' memory back: nothing but the tensors holds a mapping."""
    import gc
    module = nn.Module()
    module.register_buffer("w", torch.ones(1 << 20, dtype=torch.uint8))
    huge_pages.place_on_huge_pages(module)
    pointer = module.w.data_ptr()
    assert huge_pages.on_huge_pages(module.w) and pointer in huge_pages._mappings
    del module
    gc.collect()
    assert pointer not in huge_pages._mappings
