"""interventions.memory: new outputs with the huge-page hint (the range it marks, and nothing else)."""

from __future__ import annotations

import sys

import pytest
import torch

from interventions import memory


def test_new_output_is_a_plain_contiguous_tensor():
    y = memory.new_output((3, 3, 40, 50), torch.float64, "cpu")
    assert tuple(y.shape) == (3, 3, 40, 50) and y.dtype == torch.float64 and y.is_contiguous()
    y.fill_(0.25)  # writable, and the hint never changes what is stored
    assert float(y.sum()) == 0.25 * 3 * 3 * 40 * 50


def test_the_hint_marks_exactly_the_whole_huge_pages_inside_the_tensor(monkeypatch):
    calls = []
    monkeypatch.setattr(memory, "_madvise", lambda: (lambda addr, n, advice: calls.append((addr, n, advice)) or 0))
    t = torch.empty(3 * memory.HUGE_PAGE // 4 + 1000, dtype=torch.float32)  # 3 huge pages of bytes and a bit
    memory.hint_huge_pages(t)
    start, nbytes = t.data_ptr(), t.numel() * 4
    hp = 1 << 21
    first = -(-start // hp) * hp  # the first 2 MB boundary at or after the start
    last = (start + nbytes) // hp * hp  # the last one at or before the end
    assert calls == [(first, last - first, 14)]
    assert start <= first < last <= start + nbytes and (last - first) % hp == 0
    calls.clear()
    memory.hint_huge_pages(torch.empty(1000))  # small: no hint
    memory.hint_huge_pages(torch.empty(0))
    assert calls == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise is a Linux call")
def test_the_real_call_is_accepted_and_keeps_the_values():
    x = torch.rand(4 * memory.HUGE_PAGE // 4)
    y = memory.new_output(x.shape, x.dtype, x.device)
    y.copy_(x)
    assert torch.equal(y, x)


def test_workspace_hands_out_the_leading_rows_of_one_buffer_until_another_is_needed():
    from interventions.memory import Workspace

    work = Workspace()
    a = work.take("x", (4, 3, 5), torch.float32, "cpu")
    a.fill_(7.0)
    b = work.take("x", (2, 3, 5), torch.float32, "cpu")  # fewer rows: the same memory, kept as it was
    assert b.data_ptr() == a.data_ptr() and tuple(b.shape) == (2, 3, 5) and bool((b == 7.0).all())
    c = work.take("x", (6, 3, 5), torch.float32, "cpu")  # more rows: a new buffer
    assert tuple(c.shape) == (6, 3, 5) and c.is_contiguous()
    for other in (((6, 3, 4), torch.float32), ((6, 3, 5), torch.float64)):  # other trailing shape, dtype
        d = work.take("x", *other, "cpu")
        assert tuple(d.shape) == other[0] and d.dtype == other[1]
    assert work.take("y", (6, 3, 5), torch.float32, "cpu").data_ptr() != work.take("x", (6, 3, 5), torch.float32, "cpu").data_ptr()
