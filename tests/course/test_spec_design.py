"""Task 13.7's bench (nanocourse/spec_design.py): a replay accepts drafts up to the first wrong one and cuts k to the
room left, a choice outside 0..K_MAX is refused, and the bar stands between the designs its docstring says fail
and the worked solution."""

import pytest

from nanocourse.spec_design import COST_PER_DRAFT, K_MAX, TRACES, bar, best_fixed, fixed, measure, replay
from solutions.ch13_spec_decode import DraftLengthDesign


def test_a_step_accepts_up_to_the_first_wrong_draft_and_is_cut_to_the_room_left():
    trace = [True, True, False, True, True, True]
    run = replay(fixed(3), trace)
    # Position 0: drafts at 0..2, the third wrong: 2 accepted, 3 tokens. Position 3: room for 2 drafts, both right.
    assert run.steps == [(3, 2), (2, 2)]
    assert run.tokens == len(trace)
    assert run.cost == pytest.approx(2 + COST_PER_DRAFT * 5)


@pytest.mark.parametrize("bad", [-1, K_MAX + 1, 2.0, None])
def test_a_choice_outside_0_to_k_max_is_refused(bad):
    with pytest.raises(ValueError, match="num_drafts must return an int"):
        replay(fixed(bad), [True] * 4)


def test_the_bar_separates_every_fixed_k_from_the_worked_solution():
    best_k, best_value = best_fixed()
    assert best_k == 1
    assert all(measure(fixed(k)) < bar() for k in range(K_MAX + 1))
    assert measure(DraftLengthDesign) > bar() > best_value
    assert len(TRACES) == 200
