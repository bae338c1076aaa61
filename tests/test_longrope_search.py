"""LongRoPE's evolutionary search (``benchmarks.quality.longrope_search``), on a fitness of
the factors alone: the authors' counts, monotone factors within their range, no candidate
rated twice, the best kept, one result per seed."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.quality.longrope_search import DimMonoSearch, SearchSettings

# microsoft/LongRoPE at c9e56aa, evolution/default_hyper_params/dim_mono.json
AUTHORS = dict(population=64, iterations=40, mutations=16, crossovers=16, max_crossover_tries=20, parents=32)


def test_the_counts_are_the_authors_times_evo_scale():
    assert SearchSettings.scaled(1.0).as_dict() == {**AUTHORS, "list_step": 0.01}
    assert SearchSettings.scaled(0.25).as_dict() == dict(
        population=16, iterations=10, mutations=4, crossovers=4, max_crossover_tries=5, parents=8, list_step=0.01
    )
    with pytest.raises(ValueError, match="without a population"):
        SearchSettings.scaled(0.03)  # int(0.03 * 32) = 0 parents


def distance_to(target):
    rated = []

    def fitness(factors):
        rated.append(np.array(factors))
        return 1.0 + float(np.abs(np.asarray(factors) - target).sum())

    return fitness, rated


def test_the_search_keeps_monotone_factors_in_range_rates_each_once_and_improves():
    scale, initial = 8.0, [1.0, 1.0, 2.0, 8.0]
    target = np.array([1.5, 3.0, 6.0, 8.5])
    fitness, rated = distance_to(target)
    settings = SearchSettings.scaled(0.25)
    result = DimMonoSearch(fitness, scale, settings, seed=42).run(initial)
    assert (
        result.evaluations
        == len(rated)
        == settings.population + settings.iterations * (settings.mutations + settings.crossovers)
    )
    assert all(np.all(np.diff(f) >= 0) and f.min() >= 1.0 and f.max() <= 1.0 + scale + 1e-9 for f in rated)
    assert not any(np.allclose(a, b) for i, a in enumerate(rated) for b in rated[:i])  # none rated twice
    assert result.initial_ppl == fitness(initial) and result.ppl < result.initial_ppl
    assert result.best_curve == sorted(result.best_curve, reverse=True) and result.best_curve[-1] == result.ppl
    assert result.ppl == min(1.0 + float(np.abs(f - target).sum()) for f in rated)


def test_one_seed_gives_one_search():
    runs = [DimMonoSearch(distance_to(np.full(3, 2.0))[0], 4.0, SearchSettings.scaled(0.125), 7).run([1, 1, 4])]
    runs.append(DimMonoSearch(distance_to(np.full(3, 2.0))[0], 4.0, SearchSettings.scaled(0.125), 7).run([1, 1, 4]))
    assert runs[0] == runs[1]
