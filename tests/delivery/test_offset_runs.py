"""The done offsets of a partition cursor, kept as runs (delivery/cursor.py OffsetRuns):
the same answers as a plain set, in memory that grows with the gaps, not the offsets."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from delivery.cursor import OffsetRuns, PartitionState
from storage.cursors import PartitionCursor, offsets_to_ranges

operations = st.lists(
    st.tuples(st.sampled_from(["add", "below", "take"]), st.integers(0, 60)), max_size=80
)


@given(operations)
def test_runs_behave_as_a_set_of_offsets(ops):
    runs, model = OffsetRuns(), set()
    for op, offset in ops:
        if op == "add":
            assert runs.add(offset) == (offset not in model)
            model.add(offset)
        elif op == "below":
            gone = {o for o in model if o < offset}
            assert runs.remove_below(offset) == len(gone)
            model -= gone
        else:  # as the floor uses it: nothing is stored below the offset
            runs.remove_below(offset)
            model = {o for o in model if o >= offset}
            end = runs.take_run_at(offset)
            if offset in model:
                run = set()
                while offset + len(run) in model:
                    run.add(offset + len(run))
                assert end == offset + len(run)
                model -= run
            else:
                assert end == offset
        assert len(runs) == len(model) and bool(runs) == bool(model)
        assert all((o in runs) == (o in model) for o in range(-1, 62))
        assert runs.runs() == offsets_to_ranges(sorted(model))


def test_a_million_acks_above_a_waiting_record_are_one_run():
    state = PartitionState(0, PartitionCursor(0))
    state.end_offset = 1_000_001
    for offset in range(1, 1_000_001):  # offset 0 waits (a delayed record)
        state.mark_done(offset)
    assert state.snapshot() == PartitionCursor(0, ((1, 1_000_001),))
    assert state.backlog() == 1
    state.mark_done(0)
    assert (state.ack_floor, len(state.done)) == (1_000_001, 0)


def test_a_loaded_cursor_with_a_run_at_its_floor_is_normalised():
    state = PartitionState(0, PartitionCursor(5, ((5, 9), (12, 13))))
    assert (state.ack_floor, state.done.runs()) == (9, ((12, 13),))
