"""replaytheory: the theory of experience replay in LLM RL, as numbers you can use.

Implements ``theory.md`` (Arnal et al., ICML 2026): the compute model (section 3), staleness
noise models and the convergence bound (section 4), the optimal buffer design (section 5) and
a calculator that turns costs and constraints into a concrete configuration, with the
reuse-aware variants of section 10 (by default the self-correlated one, section 10.11);
simulators of the asynchronous pipeline (sections 1-2) and of the synchronous replay process
(section 4), and the calibration of sigma, rho, kappa (and section 10's c and f) from probe
measurements. numpy + scipy only.
"""

from .model.bound import (BoundConditionError, BoundResult, VarianceTerms, convergence_bound,
                          step_size_limit, variance_terms)
from .calculator import DEFAULT_REUSE, ReplayRecommendation, design_grid, optimal_config
from .fit.bound_fit import check_decomposition, fit_bias, fit_coupling, fit_noise_model
from .fit.calibrate import Calibration, calibrate
from .model.compute import (compute_ratio, cost_per_update, estimate_mu, expected_replay_ratio,
                            gamma_table, generation_share, mu_from_costs, paper_gamma_tables)
from .model.design import (Design, FiniteLRDesign, finite_lr_design, finite_lr_objective,
                           k_function, objective, objective_rbn, optimal_design, optimal_horizon,
                           optimal_replay_ratio, power_law_optimum, profile_objective)
from .model.noise import ConstantNoise, NoiseModel, PowerLawNoise, TabulatedNoise, noise_from_dict
from .sim.pipeline_sim import PipelineResult, simulate_pipeline
from .sim.replay_sim import ReplayResult, simulate_replay
from .model.reuse import ConstantReuse, ExpContribution, TabulatedReuse
from .sim.sim_quadratic import QuadraticProblem
from .sim.sim_tabular import TabularProblem

__version__ = "0.1.0"

__all__ = [
    "BoundConditionError", "BoundResult", "Calibration", "ConstantNoise", "ConstantReuse",
    "DEFAULT_REUSE", "Design", "ExpContribution", "FiniteLRDesign", "NoiseModel",
    "PipelineResult", "PowerLawNoise", "QuadraticProblem", "ReplayRecommendation",
    "ReplayResult", "TabularProblem", "TabulatedNoise", "TabulatedReuse", "VarianceTerms",
    "calibrate",
    "check_decomposition", "compute_ratio", "convergence_bound", "cost_per_update",
    "design_grid", "estimate_mu", "expected_replay_ratio", "finite_lr_design",
    "finite_lr_objective", "fit_bias", "fit_coupling", "fit_noise_model", "gamma_table",
    "generation_share", "k_function", "mu_from_costs", "noise_from_dict", "objective",
    "objective_rbn", "optimal_config", "optimal_design", "optimal_horizon",
    "optimal_replay_ratio", "paper_gamma_tables", "power_law_optimum", "profile_objective",
    "simulate_pipeline", "simulate_replay", "step_size_limit", "variance_terms",
]
