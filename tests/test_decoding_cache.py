"""The decoding cache's buffers (modules/decoding_cache.py): a reorder leaves one position
of room, an append writes into it and equals ``torch.cat``; nothing else is written in
place: not a slice of a longer tensor, not a tensor autograd records, not an append
longer than the room."""

import torch

from fairseq_distattn.modules.decoding_cache import ROOM, appended, reordered_with_room

B, H, T, W = 3, 2, 4, 5


def cache(seed=0, length=T, requires_grad=False):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(B, H, length, W, generator=generator, dtype=torch.float64, requires_grad=requires_grad)


def test_a_reorder_then_an_append_equal_index_select_then_cat_and_write_in_place():
    cached, new, order = cache(0), cache(1, length=1), torch.tensor([2, 2, 0])
    with torch.no_grad():
        reordered = reordered_with_room(cached, order)
        assert torch.equal(reordered, cached.index_select(0, order)) and getattr(reordered, ROOM) == 1
        grown = appended(reordered, new)
    assert torch.equal(grown, torch.cat([cached.index_select(0, order), new], dim=2))
    assert grown.data_ptr() == reordered.data_ptr()  # the reorder's buffer, no copy
    assert getattr(grown, ROOM, 0) == 0
    with torch.no_grad():  # full now: the next append copies
        again = appended(grown, new)
    assert again.data_ptr() != grown.data_ptr() and torch.equal(again, torch.cat([grown, new], dim=2))


def test_a_reorder_to_fewer_rows_keeps_its_room():
    """Beam search drops finished sentences: the order is shorter than the batch."""
    cached, new = cache(2), cache(3, length=1)[:2]
    with torch.no_grad():
        grown = appended(reordered_with_room(cached, torch.tensor([1, 0])), new)
    assert torch.equal(grown, torch.cat([cached[[1, 0]], new], dim=2))


def test_a_slice_of_a_longer_tensor_is_never_written():
    longer, new = cache(4, length=T + 3), cache(5, length=1)
    before = longer.clone()
    with torch.no_grad():
        grown = appended(longer[:, :, :T], new)
    assert torch.equal(longer, before)
    assert torch.equal(grown, torch.cat([longer[:, :, :T], new], dim=2))


def test_an_append_longer_than_the_room_copies():
    cached, new = cache(6), cache(7, length=2)
    with torch.no_grad():
        reordered = reordered_with_room(cached, torch.arange(B))
        grown = appended(reordered, new)
    assert grown.data_ptr() != reordered.data_ptr()
    assert torch.equal(grown, torch.cat([cached, new], dim=2))


def test_what_autograd_records_is_copied_and_keeps_its_gradient():
    cached, new = cache(8, requires_grad=True), cache(9, length=1, requires_grad=True)
    reordered = reordered_with_room(cached, torch.tensor([1, 1, 2]))
    assert getattr(reordered, ROOM, 0) == 0
    grown = appended(reordered, new)
    grown.sum().backward()
    assert torch.equal(
        cached.grad[:, :, 0], torch.tensor([0.0, 2.0, 1.0], dtype=torch.float64)[:, None, None].expand(B, H, W)
    )
    assert torch.equal(new.grad, torch.ones_like(new))
    with torch.no_grad():
        room = reordered_with_room(cached.detach(), torch.arange(B))
    assert appended(room, new).data_ptr() != room.data_ptr()  # new is recorded: copied
