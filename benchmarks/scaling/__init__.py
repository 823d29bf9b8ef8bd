"""A cost model of gravac's step from 2 to 1,024 workers (docs/SCALING.md).

α-β costs of every exchange and measured local compression costs, calibrated and validated
in the sandbox, projected to clusters. Every size (entries kept, chunk and index-field
bytes, PowerSGD's ranks) is the engine's own arithmetic, ``gravac/util/sizes.py``.

The model (no overlap of communication with compute, gravac's default)::

    t_step = t_compute + t_local + t_comm

* t_comm: the collectives the step engine issues for the exchange, round by round, each
  priced with the α-β cost of its algorithm on the link it crosses (ring allreduce, ring
  allgather, binomial-tree broadcast: what Gloo runs);
* t_local: error feedback, selection, residual update, pack and unpack, from per-element
  costs measured on this machine (``measure-compression``);
* t_compute: forward, backward and the optimizer update: measured (validation) or given
  (projection).

One purpose per module: ``network`` (links, layouts, collectives), ``shapes`` (what a
model's layers keep and send), ``rounds`` (the collectives of a step per exchange),
``local`` (local work, CPU sharing), ``step`` (t_step), ``crossovers``, ``fitting`` (least
squares), ``calibration``, ``measure`` (``measure-compression``), ``models`` (shapes and
FLOPs of train.py configs), ``runs`` (recorded runs), ``validation``, ``projection``,
``plot``, ``commands`` (what each subcommand does), ``cli`` (its arguments) and
``__main__`` (``python benchmarks/scaling ...``).

Example (as a package, from the repository root)::

    from benchmarks import scaling as S
    model = S.ModelShapes.from_params([("w", (1000, 1000)), ("b", (1000,))])
    net = S.Network(inter=S.Link.from_gbit(10, 25e-6), local=S.Link.from_gbit(200, 5e-6))
    layout = S.Layout(hosts=4, slots=8)
    S.comm_time(S.StepCase("allgather_coded", theta=100), model, layout, net)   # seconds
"""
from .calibration import OP_KIND, calibrate, fit_lockstep, pool_lockstep
from .cli import main
from .crossovers import (allgather_crossover_exact, crossover_n, index_bytes_per_entry,
                         shared_index_crossover_approx)
from .errors import CliError
from .fitting import fit_link, least_squares
from .local import NO_LOCAL, CompressionCosts, CpuSharing, contention, leader_share, local_time
from .measure import (fit_compression, measure_compression, measure_compression_concurrent,
                      slowest_samples)
from .models import PAPER_MODELS, build_config_model, shapes_from_config, training_flops
from .network import (COLLECTIVES, Layout, Link, Network, broadcast_time, collective_terms,
                      ring_allgather_time, ring_allreduce_time)
from .projection import Projection, project, projection_cases
from .rounds import (EXCHANGES, Collective, StepCase, comm_time, index_buffer_bytes,
                     recorded_bytes, round_time, step_rounds)
from .runs import case_of, exchange_of, load_run_config, read_steps
from .shapes import LowRank, ModelShapes
from .step import StepTime, step_time
from .validation import RunCheck, check_run, format_checks

#: The package's modules, each with its own doctests (tests/unit/test_scaling.py runs them).
MODULES = ("calibration", "cli", "commands", "crossovers", "errors", "fitting", "local", "measure",
           "models", "network", "plot", "projection", "rounds", "runs", "shapes", "step",
           "validation")

__all__ = ["COLLECTIVES", "EXCHANGES", "NO_LOCAL", "OP_KIND", "PAPER_MODELS", "CliError",
           "Collective", "CompressionCosts", "CpuSharing", "Layout", "Link", "LowRank",
           "ModelShapes", "Network", "Projection", "RunCheck", "StepCase", "StepTime",
           "allgather_crossover_exact", "broadcast_time", "build_config_model", "calibrate",
           "case_of", "check_run", "collective_terms", "comm_time", "contention",
           "crossover_n", "exchange_of", "fit_compression", "fit_link", "fit_lockstep",
           "format_checks", "index_buffer_bytes", "index_bytes_per_entry", "leader_share",
           "least_squares", "load_run_config", "local_time", "main", "measure_compression",
           "measure_compression_concurrent", "pool_lockstep", "project", "projection_cases",
           "read_steps", "recorded_bytes", "ring_allgather_time", "ring_allreduce_time",
           "round_time", "shapes_from_config", "shared_index_crossover_approx",
           "slowest_samples", "step_rounds", "step_time", "training_flops"]
