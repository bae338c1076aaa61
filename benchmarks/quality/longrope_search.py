"""LongRoPE's evolutionary search for per-pair rescale factors (Ding et al. 2024,
*LongRoPE: Extending LLM Context Window Beyond 2 Million Tokens*, Section 3.2), restated
from microsoft/LongRoPE at c9e56aa: ``evolution/algorithms/genetic_base.py``
(``GeneticAlgorithm.run_genetic_algorithm``) and ``evolution/algorithms/dim_mono.py``
(``DimMonoGeneticAlgorithm``), the algorithm its example scripts run, with the
hyper-parameters of ``evolution/default_hyper_params/dim_mono.json``.

The search: generation 0 is the starting factors (``longrope_initial_factors``: YaRN's)
and mutations of it; each iteration keeps the best ``parents`` by perplexity, then adds
``mutations`` mutants of random parents and ``crossovers`` children of random parent
pairs (a mutant of the first parent where crossing finds no new child). A mutation
redraws each factor with probability 0.3 from a grid of step ``list_step`` between its
neighbours (so the factors stay non-decreasing over the pairs: the lowest frequencies
are interpolated most), until the result is monotone and not tried before; a crossover
takes each factor from the second parent with probability 0.3 x 0.5. The authors scale
every count by ``evo_scale`` (1 in their runs); the factors found are the best of the
final population.

Pure Python and numpy: ``fitness`` (factors -> perplexity) is the caller's.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Callable, List, Optional, Sequence

import numpy as np

# evolution/default_hyper_params/dim_mono.json at c9e56aa (evo_scale 1)
POPULATION, ITERATIONS, MUTATIONS, CROSSOVERS, MAX_CROSSOVER_TRIES, PARENTS, LIST_STEP = 64, 40, 16, 16, 20, 32, 0.01
# the share of factors a mutation redraws, and of those a crossover considers, in dim_mono.py
REDRAWN = 0.3


@dataclass(frozen=True)
class SearchSettings:
    """The search's counts: the authors' dim_mono.json, each times ``evo_scale`` (their int())."""

    population: int
    iterations: int
    mutations: int
    crossovers: int
    max_crossover_tries: int
    parents: int
    list_step: float = LIST_STEP

    @classmethod
    def scaled(cls, evo_scale: float) -> "SearchSettings":
        counts = (POPULATION, ITERATIONS, MUTATIONS, CROSSOVERS, MAX_CROSSOVER_TRIES, PARENTS)
        settings = cls(*(int(evo_scale * count) for count in counts))
        if min(settings.population, settings.iterations, settings.parents) < 1 or settings.parents < 2:
            raise ValueError(f"evo_scale {evo_scale} leaves the search without a population: {settings}")
        return settings

    def as_dict(self) -> dict:
        return {field.name: getattr(self, field.name) for field in fields(self)}


@dataclass
class Individual:
    factors: np.ndarray
    ppl: float


@dataclass
class SearchResult:
    factors: List[float]
    ppl: float
    initial_ppl: float
    evaluations: int
    # the best perplexity at the start of each iteration, then of the final population
    best_curve: List[float]


class DimMonoSearch:
    """``DimMonoGeneticAlgorithm`` on a ``fitness`` of the factors (lower is better), for a
    context-length ``scale`` (the factors range over [1, 1 + scale])."""

    def __init__(self, fitness: Callable[[np.ndarray], float], scale: float, settings: SearchSettings, seed: int):
        self.fitness, self.scale, self.settings = fitness, scale, settings
        self.rng = np.random.RandomState(seed)
        self.history: List[np.ndarray] = []

    def tried(self, factors: np.ndarray) -> bool:
        return any(np.allclose(factors, other) for other in self.history)

    def make(self, factors: np.ndarray) -> Individual:
        self.history.append(factors)
        return Individual(factors, float(self.fitness(factors)))

    def mutate(self, parent: Individual) -> Individual:
        step = self.settings.list_step
        top = np.arange(1.0, 1.0 + self.scale + step, step).max()
        factors = parent.factors
        while self.tried(factors) or not np.all(np.diff(factors) >= 0):
            for dim in range(factors.shape[0]):
                if self.rng.rand() < REDRAWN:
                    low = 1.0 if dim == 0 else factors[dim - 1]
                    high = top if dim == factors.shape[0] - 1 else factors[dim + 1]
                    choices = np.arange(low, high + step, step) if dim else np.arange(low, high, step)
                    if choices.shape[0] > 0:
                        factors = factors.copy()
                        factors[dim] = choices[self.rng.randint(0, choices.shape[0])]
        return self.make(factors)

    def crossover(self, first: Individual, second: Individual) -> Optional[Individual]:
        if np.allclose(first.factors, second.factors):
            return None
        factors = first.factors.copy()
        for _ in range(self.settings.max_crossover_tries):
            for dim in range(factors.shape[0]):
                if self.rng.rand() < REDRAWN:
                    factors = factors.copy()
                    if self.rng.rand() < 0.5:
                        factors[dim] = second.factors[dim]
                    if self.tried(factors) or not np.all(np.diff(factors) >= 0):
                        continue
                    return self.make(factors)
        return None

    def run(self, initial: Sequence[float]) -> SearchResult:
        s = self.settings
        first = self.make(np.asarray(initial, dtype=np.float64))
        population = [first] + [self.mutate(first) for _ in range(s.population - 1)]
        curve = []
        for _ in range(s.iterations):
            parents = sorted(population, key=lambda individual: individual.ppl)[: s.parents]
            curve.append(parents[0].ppl)
            population = list(parents)
            for _ in range(s.mutations):
                population.append(self.mutate(parents[self.rng.randint(len(parents))]))
            for _ in range(s.crossovers):
                one, two = sorted(self.rng.choice(len(parents), 2, replace=False))
                child = self.crossover(parents[one], parents[two])
                population.append(child if child is not None else self.mutate(parents[one]))
        best = min(population, key=lambda individual: individual.ppl)
        curve.append(best.ppl)
        return SearchResult([float(f) for f in best.factors], best.ppl, first.ppl, len(self.history), curve)
