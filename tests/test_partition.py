"""PATE's teacher partitions: what PartitionedSampler refuses and how fairly it draws.

The partitions are the privacy argument (one record, one teacher), so every malformed part
must be refused when the sampler is built or restored, not discovered (or not) at draw time.
"""
from __future__ import annotations

import pytest
import torch

from lightning_dpgan.data.partition import PartitionedSampler, disjoint_partitions, records_digest, teacher_partitions


def test_teacher_partitions_are_the_disjoint_parts_each_sorted() -> None:
    """Datamodules hand PATE strategies sorted row positions: the same parts as
    disjoint_partitions, each in increasing order."""
    raw = disjoint_partitions(50, 4, seed=3)
    sorted_parts = teacher_partitions(50, 4, seed=3)
    for part, expected in zip(sorted_parts, raw, strict=True):
        assert part.tolist() == sorted(expected.tolist())
    assert any(part.tolist() != sorted(part.tolist()) for part in raw)  # the sort is not a no-op here


def test_a_negative_index_is_refused_since_it_aliases_a_record_of_another_teacher() -> None:
    """Index -1 is row n-1 to torch: with n-1 in another part, one record would reach two
    teachers, and the overlap check (on the index values) could not see it."""
    data = torch.arange(10.0).unsqueeze(1)
    with pytest.raises(ValueError, match=r"\[0, 10\)"):
        PartitionedSampler(data, [torch.tensor([-1, 0, 1]), torch.tensor([9, 2, 3])], batch_size=2)


def test_parts_sharing_a_single_record_are_refused() -> None:
    """One record in two teachers' parts changes two votes: twice the sensitivity the noise and
    the accountant assume. A single shared record is refused as a larger overlap is."""
    data = torch.randn(20, 2)
    with pytest.raises(ValueError, match="overlap"):
        PartitionedSampler(data, [torch.arange(0, 10), torch.arange(9, 20)], batch_size=2)


def test_an_index_equal_to_the_record_count_is_refused() -> None:
    """Row n does not exist: refused when the sampler is built, not an IndexError mid-training."""
    data = torch.arange(10.0).unsqueeze(1)
    with pytest.raises(ValueError, match=r"\[0, 10\)"):
        PartitionedSampler(data, [torch.tensor([0, 1, 10]), torch.tensor([2, 3])], batch_size=1)


def test_an_empty_partition_is_refused_even_with_replacement() -> None:
    """A teacher without records would draw padding (another teacher's record) with replacement."""
    data = torch.arange(10.0).unsqueeze(1)
    with pytest.raises(ValueError, match="at least one record"):
        PartitionedSampler(data, [torch.arange(0, 5), torch.tensor([], dtype=torch.long)], batch_size=2, replacement=True)


def test_the_batch_is_checked_against_the_smallest_partition_not_the_largest() -> None:
    """Without replacement a teacher needs batch_size distinct records of its own part: parts of
    8 and 3 records cannot give batches of 5."""
    data = torch.arange(11.0).unsqueeze(1)
    parts = [torch.arange(0, 8), torch.arange(8, 11)]
    with pytest.raises(ValueError, match="smallest partition"):
        PartitionedSampler(data, parts, batch_size=5)
    PartitionedSampler(data, parts, batch_size=3)  # the smallest part's size is a valid batch


def test_labels_must_match_the_records() -> None:
    with pytest.raises(ValueError, match="labels"):
        PartitionedSampler(torch.randn(10, 2), disjoint_partitions(10, 2, seed=0), 2, labels=torch.zeros(9))


def test_draws_with_replacement_are_uniform_within_each_part_of_unequal_size() -> None:
    """Each record of a part is equally likely: a part of 2 records next to one of 10 must draw
    each of its two about half of the time (a slot scaled by the largest part and clamped would
    put almost all of the small part's draws on its last record)."""
    data = torch.arange(12.0).unsqueeze(1)
    parts = [torch.tensor([0, 1]), torch.arange(2, 12)]
    sampler = PartitionedSampler(data, parts, batch_size=50, replacement=True, seed=0)
    drawn = sampler.draw_indices(40)[:, 0].reshape(-1)  # 2000 draws of teacher 0
    share = (drawn == 0).double().mean().item()
    assert abs(share - 0.5) < 0.05, share  # binomial sd ~0.011
    counts = torch.bincount(sampler.draw_indices(40)[:, 1].reshape(-1) - 2, minlength=10).double()
    assert (counts / counts.sum() - 0.1).abs().max() < 0.03, counts


def test_a_state_of_another_record_count_is_refused_even_without_a_digest() -> None:
    """Checkpoints written before the digest was kept have none: the record count is then the
    only check that the partitions were drawn for these rows."""
    state = PartitionedSampler(torch.randn(60, 2), disjoint_partitions(60, 6, seed=4), 4).state_dict()
    del state["records_digest"]
    other = PartitionedSampler(torch.randn(61, 2), disjoint_partitions(61, 6, seed=0), 4)
    with pytest.raises(ValueError, match="saved for 60 records"):
        other.load_state_dict(state)


def test_a_state_of_an_unknown_format_is_refused() -> None:
    data = torch.randn(60, 2)
    sampler = PartitionedSampler(data, disjoint_partitions(60, 6, seed=4), 4)
    state = sampler.state_dict()
    for fmt in (None, 2):
        bad = dict(state)
        if fmt is None:
            del bad["format"]
        else:
            bad["format"] = fmt
        with pytest.raises(ValueError, match="format"):
            sampler.load_state_dict(bad)


def test_the_records_digest_tells_the_same_bytes_in_other_shapes_apart() -> None:
    """One buffer as 60 records of 2 values, or as 60 records of 1 value plus 60 labels, is
    another table: the digest must differ although every byte is the same."""
    values = torch.randn(120)
    assert records_digest(values.reshape(60, 2)) != records_digest(values[:60].reshape(60, 1), values[60:])
    assert records_digest(values.reshape(60, 2)) != records_digest(values.reshape(40, 3))
    assert records_digest(values.reshape(60, 2)) == records_digest(values.clone().reshape(60, 2))
