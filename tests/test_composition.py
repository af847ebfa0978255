"""Basic composition of preprocessing costs (Dwork & Roth 2014, Theorem 3.16): ε and δ add up."""
import pytest

from lightning_dpgan.privacy.composition import compose_costs


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


def test_a_free_part_does_not_set_the_relation():
    composed = compose_costs({"a": cost(1.0, 0.0, "x", neighbours="replace-one"), "free": cost(0.0, 0.0, "public")})
    assert composed["neighbours"] == "replace-one"
