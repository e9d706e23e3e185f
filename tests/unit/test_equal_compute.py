"""The equal-compute report's 'fraction of MLM's compute to reach MLM's final accuracy', on curves made up here."""

from experiments import equal_compute

FRACTIONS = (0.25, 0.5, 0.75, 1.0)


def _runs(*curves: list[float]) -> list[dict]:
    """One record per seed; every probe task gets the same curve (accuracy at 1/4, 1/2, 3/4, 1 of the budget)."""
    return [{"checkpoints": [{"fraction_of_budget": f, "probes": {t: {"accuracy": {feat: a}} for t, feat in equal_compute.PROBES}}
                             for f, a in zip(FRACTIONS, curve)]} for curve in curves]


def test_fraction_to_reach_interpolates_the_seed_mean_from_the_random_init_point():
    base = {"probes": {"1": {t: {"accuracy": {feat: 0.2}} for t, feat in equal_compute.PROBES}}}
    records = {
        "MLM": _runs([0.3, 0.4, 0.5, 0.6], [0.3, 0.4, 0.5, 0.8]),  # final mean 0.7
        "FAST": _runs([0.5, 0.9, 0.9, 0.9], [0.5, 0.5, 0.9, 0.9]),  # mean 0.5, 0.7 (hit at 1/2 exactly), ...
        "STEEP": _runs([0.95, 1.0, 1.0, 1.0]),  # crosses 0.7 between 0 (0.2) and 1/4 (0.95): 0.25 * 0.5 / 0.75
        "SLOW": _runs([0.3, 0.4, 0.5, 0.6]),  # never reaches 0.7
    }
    reach = equal_compute.fractions_to_reach_mlm(records, base)
    assert set(reach) == set(equal_compute.PROBES)
    per = reach[equal_compute.PROBES[0]]
    assert abs(per["FAST"] - 0.5) < 1e-12
    assert abs(per["STEEP"] - 0.25 * (0.7 - 0.2) / (0.95 - 0.2)) < 1e-12
    assert per["SLOW"] is None
    assert abs(per["MLM"] - 1.0) < 1e-12  # MLM reaches its own final value at its end


def test_first_crossing_edges():
    assert equal_compute.first_crossing([(0.0, 0.8), (0.5, 0.9)], 0.7) == 0.0  # already there at the start
    assert equal_compute.first_crossing([(0.0, 0.5), (0.5, 0.6)], 0.7) is None
    assert equal_compute.first_crossing([], 0.7) is None
    assert abs(equal_compute.first_crossing([(0.25, 0.5), (0.5, 0.5), (0.75, 0.9)], 0.7) - 0.625) < 1e-12


def _ft(curves: dict[int, list[float]]) -> list[dict]:
    """One record; checkpoint index -> that checkpoint's BBC fine-tuning accuracies (absent: not fine-tuned)."""
    return [{"checkpoints": [{"fraction_of_budget": f, **({"finetune": {"bbc": {"accuracy": curves[i]}}} if i in curves else {})}
                             for i, f in enumerate(FRACTIONS)]}]


def test_finetune_reach_marks_a_hit_at_the_first_fine_tuned_checkpoint_as_an_upper_bound():
    records = {"MLM": _ft({3: [0.7, 0.9]}), "EARLY": _ft({0: [0.85], 1: [0.9], 2: [0.9], 3: [0.9]}),
               "LATE": _ft({0: [0.6], 1: [0.7], 2: [0.9], 3: [0.95]}), "FINAL_ONLY": _ft({3: [0.7]})}
    reach = equal_compute.finetune_reach(records)
    assert reach["EARLY"] == (0.25, True)
    hit, bound = reach["LATE"]
    assert abs(hit - 0.625) < 1e-12 and not bound  # 0.8 lies half way between 0.7 (at 1/2) and 0.9 (at 3/4)
    assert reach["FINAL_ONLY"] == (None, False)
    assert reach["MLM"] == (1.0, False)


def test_two_stage_plan_gives_each_stage_its_share_at_its_own_cost(prepared):
    """ELECTRA two-stage: stage 1 (generator MLM) and stage 2 (RTD + the frozen generator's forward) cost differently;
    half the budget goes to each, and the whole run spends the budget to within a step."""
    plan = equal_compute.plan(["MLM", "ELECTRA-2stage"], prepared, 100)
    two = plan["ELECTRA-2stage"]
    first, second = two["stage_flops_per_step"]
    assert first < second  # stage 2 trains the discriminator and also runs the generator forward
    budget = plan["MLM"]["flops"]
    assert abs(two["stage_one_steps"] * first - budget / 2) <= first
    assert abs(two["flops"] - budget) <= 4 * second and two["steps"] % 4 == 0
    assert two["extra"] == [f"objective.electra.two_stage_generator_steps={two['stage_one_steps']}"]
