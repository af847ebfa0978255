"""Basic composition of preprocessing costs (Dwork & Roth 2014, Theorem 3.16): ε and δ add up."""
import math

import pytest

from lightning_dpgan.callbacks.pate import PATEAggregation
from lightning_dpgan.callbacks.strategy import epsilon_parts
from lightning_dpgan.privacy.composition import compose_costs, release_fields


def cost(epsilon, delta, mechanism, **extra):
    return {"epsilon": epsilon, "delta": delta, "mechanism": mechanism, **extra}


def test_epsilons_and_deltas_of_the_parts_add_up():
    composed = compose_costs({"bounds": cost(0.1, 1e-6, "DP bounds"), "modes": cost(0.25, 2e-6, "DP modes")})
    assert composed["epsilon"] == pytest.approx(0.35)
    assert composed["delta"] == pytest.approx(3e-6)  # summed, not the larger of the two
    assert composed["neighbours"] == "add-remove"
    assert composed["parts"] == {"bounds": cost(0.1, 1e-6, "DP bounds"), "modes": cost(0.25, 2e-6, "DP modes")}
    assert "bounds: DP bounds" in composed["mechanism"] and "modes: DP modes" in composed["mechanism"]


def test_three_parts_add_up_and_a_free_part_adds_nothing():
    composed = compose_costs({"a": cost(1.0, 1e-7, "x"), "b": cost(2.0, 0.0, "y"), "free": cost(0.0, 0.0, "public")})
    assert (composed["epsilon"], composed["delta"]) == (pytest.approx(3.0), pytest.approx(1e-7))


def test_parts_for_different_neighbouring_relations_are_refused():
    with pytest.raises(ValueError, match="different neighbouring relations"):
        compose_costs({"a": cost(1.0, 0.0, "x"), "b": cost(1.0, 0.0, "y", neighbours="replace-one")})
    # a part that spends only delta spends something: its relation must agree too
    with pytest.raises(ValueError, match="different neighbouring relations"):
        compose_costs({"a": cost(1.0, 0.0, "x"), "b": cost(0.0, 1e-6, "y", neighbours="replace-one")})


def test_a_free_part_does_not_set_the_relation():
    composed = compose_costs({"a": cost(1.0, 0.0, "x", neighbours="replace-one"), "free": cost(0.0, 0.0, "public")})
    assert composed["neighbours"] == "replace-one"


def test_a_composite_cost_is_restated_for_replace_one_part_by_part():
    """A DP schema (2, 1e-6) and DP modes (0.1, 0), both add/remove: under PATE's replace-one each
    is (2 eps, (1 + e^eps) delta) by group privacy, then they add up -- delta (1 + e^2) 1e-6, not
    the (1 + e^2.1) 1e-6 of restating their sum, which left training less of its delta."""
    import math

    from lightning_dpgan.callbacks.pate import PATEAggregation

    data = compose_costs({"schema": {"epsilon": 2.0, "delta": 1e-6, "mechanism": "bounds"},
                          "modes": {"epsilon": 0.1, "delta": 0.0, "mechanism": "histogram"}})
    composed = PATEAggregation(target_epsilon=10.0, delta=1e-4).composed_preprocessing(data, {})
    assert composed["epsilon"] == pytest.approx(4.2)
    assert composed["delta"] == pytest.approx((1 + math.exp(2.0)) * 1e-6)
    assert composed["as_spent"] == {"epsilon": 2.1, "delta": 1e-6, "neighbours": "add-remove"}
    assert composed["neighbours"] == "replace-one"


def test_a_dp_schemas_columns_are_restated_one_by_one():
    """A DP schema estimate is itself a basic composition, each of its columns estimated on its own
    share. Restated column by column for PATE's replace-one it costs the sum of (1 + e^eps_c)
    delta_c: here 2 (1 + e) 5e-7 = 3.7e-6, where restating the block's (3, 1e-6) as one gave
    (1 + e^3) 1e-6 = 2.1e-5 and refused runs a valid restatement fits."""
    import math

    from lightning_dpgan.callbacks.pate import PATEAggregation

    columns = {"amount": {"epsilon": 1.0, "delta": 0.0, "mechanism": "laplace histogram on a geometric grid"},
               "channel": {"epsilon": 1.0, "delta": 5e-7, "mechanism": "stability-based histogram"},
               "fraud": {"epsilon": 1.0, "delta": 5e-7, "mechanism": "stability-based histogram"}}
    schema = {"epsilon": 3.0, "delta": 1e-6, "mechanism": "DP schema estimate", "neighbours": "add-remove",
              "columns": columns}
    strategy = PATEAggregation(target_epsilon=10.0, delta=1e-4)
    for data in (schema, compose_costs({"schema": schema, "modes": {"epsilon": 0.1, "delta": 0.0, "mechanism": "h"}})):
        composed = strategy.composed_preprocessing(data, {})
        assert composed["epsilon"] == pytest.approx(2 * data["epsilon"])
        assert composed["delta"] == pytest.approx(2 * (1 + math.e) * 5e-7)
        assert composed["as_spent"] == {"epsilon": data["epsilon"], "delta": 1e-6, "neighbours": "add-remove"}
        # the columns are recorded restated, adding up to the schema's line, each with what it spent:
        # they kept their add/remove shares, which added up to as_spent under a replace-one header
        recorded = composed if "columns" in composed else composed["parts"]["schema"]
        assert sum(column["epsilon"] for column in recorded["columns"].values()) == pytest.approx(2 * 3.0)
        assert sum(column["delta"] for column in recorded["columns"].values()) == pytest.approx(recorded["delta"])
        assert recorded["columns"]["channel"]["neighbours"] == "replace-one"
        assert recorded["columns"]["channel"]["as_spent"] == {"epsilon": 1.0, "delta": 5e-7, "neighbours": "add-remove"}
        assert recorded["columns"]["channel"]["mechanism"] == "stability-based histogram"
        assert columns["channel"] == {"epsilon": 1.0, "delta": 5e-7, "mechanism": "stability-based histogram"}


def test_a_cost_whose_restated_delta_overflows_is_restated_as_infinite_not_a_traceback():
    """(1 + e^eps) delta for eps above ~709 overflowed math.exp: --data.bounds_epsilon 800 under
    a PATE strategy ended in OverflowError. Any delta passes it: infinite, which the delta check
    refuses by name. A part that spent no delta still spends none."""
    import math

    from lightning_dpgan.callbacks.pate import PATEAggregation

    strategy = PATEAggregation(target_epsilon=2000.0, delta=1e-4)
    assert strategy.composed_preprocessing({"epsilon": 800.0, "delta": 1e-6}, {})["delta"] == math.inf
    assert strategy.composed_preprocessing({"epsilon": 800.0, "delta": 0.0}, {})["delta"] == 0.0


def test_every_part_is_kept_as_given_free_ones_included_and_as_a_copy():
    """``parts`` keeps each cost as given -- a part that spends nothing too -- so a resume can
    restore them one by one; changing the composed record leaves the callers' costs alone."""
    free = cost(0.0, 0.0, "public schema")
    bounds = cost(1.0, 1e-7, "DP bounds")
    composed = compose_costs({"schema": free, "bounds": bounds})
    assert composed["parts"] == {"schema": cost(0.0, 0.0, "public schema"), "bounds": cost(1.0, 1e-7, "DP bounds")}
    assert "schema: public schema" in composed["mechanism"]
    composed["parts"]["bounds"]["epsilon"] = 99.0
    assert bounds["epsilon"] == 1.0


def test_nothing_spent_composes_to_zero_under_add_remove():
    composed = compose_costs({"schema": cost(0.0, 0.0, "public schema")})
    assert (composed["epsilon"], composed["delta"], composed["neighbours"]) == (0.0, 0.0, "add-remove")
    assert isinstance(composed["epsilon"], float) and isinstance(composed["delta"], float)


def test_a_replace_one_strategy_restates_the_data_cost_and_each_release():
    """Under PATE's replace-one, an add/remove (eps, delta) costs (2 eps, (1 + e^eps) delta): the
    data's cost alone (no releases) and a QUAIL label model's release both."""
    strategy = PATEAggregation(target_epsilon=10.0, delta=1e-4)
    alone = strategy.composed_preprocessing({"epsilon": 0.5, "delta": 1e-6, "mechanism": "bounds"}, {})
    assert alone["epsilon"] == pytest.approx(1.0) and alone["delta"] == pytest.approx((1 + math.exp(0.5)) * 1e-6)
    assert alone["neighbours"] == "replace-one"
    both = strategy.composed_preprocessing({"epsilon": 0.5, "delta": 0.0, "mechanism": "bounds"},
                                           {"quail_label_model": {"epsilon": 1.0, "delta": 1e-6, "mechanism": "m"}})
    assert both["epsilon"] == pytest.approx(3.0)
    assert both["delta"] == pytest.approx((1 + math.e) * 1e-6)
    assert both["neighbours"] == "replace-one"


def test_a_refusal_names_each_parts_own_epsilon():
    composed = compose_costs({"schema": {"epsilon": 0.3, "delta": 0.0, "mechanism": "bounds"},
                              "modes": {"epsilon": 0.2, "delta": 0.0, "mechanism": "histogram"}})
    assert epsilon_parts(composed) == "schema 0.3 (bounds), modes 0.2 (histogram)"


def test_a_release_to_compose_keeps_its_four_fields_and_must_state_them_all():
    """A strategy composes a prior release (QUAIL's label model) from its epsilon, delta,
    neighbouring relation and mechanism: anything else in the cost stays out, and a release that
    lacks one of the four is refused by name (it was a KeyError naming the key alone)."""
    cost = {"epsilon": 0.5, "delta": 1e-6, "neighbours": "add-remove", "mechanism": "dp-sgd", "split": 0.5}
    assert release_fields(cost) == {"epsilon": 0.5, "delta": 1e-6, "neighbours": "add-remove", "mechanism": "dp-sgd"}
    with pytest.raises(ValueError, match=r"must state epsilon, delta, neighbours, mechanism; this one lacks "
                                         r"neighbours, mechanism"):
        release_fields({"epsilon": 0.5, "delta": 1e-6})
    strategy = PATEAggregation(target_epsilon=1.0, delta=1e-5)  # what a strategy composes from Python: the same
    with pytest.raises(ValueError, match="this one lacks neighbours"):
        strategy.add_prior_release("label_model", {"epsilon": 0.5, "delta": 1e-6, "mechanism": "dp-sgd"})
    strategy.add_prior_release("label_model", cost)
    assert strategy.prior_releases == {"label_model": release_fields(cost)}
