"""heterotrain: heterogeneous data-parallel training for torchrun scripts.

Each rank r trains a local batch b_r sized to its speed (sum = global batch
B); the split (the plan) comes from the HeteroTrain operator's plan
ConfigMap or a plan file and changes while training runs, every rank
switching at the same step. See README.md.
"""

from .core import HeteroTrain, fetch, load_checkpoint
from .loader import HeteroBatchSampler
from .hook import HeteroHookState, hetero_allreduce_hook
from .metrics import TrainerMetrics
from .plan import BatchPlan, PlanError, PlanGate
from .sampler import HeteroSampler, epoch_order, steps_per_epoch
from .sources import ConfigMapPlanSource, FilePlanSource

__version__ = "0.1.0"

__all__ = [
    "init", "HeteroTrain", "HeteroBatchSampler", "BatchPlan", "PlanError", "PlanGate", "HeteroSampler",
    "HeteroHookState", "hetero_allreduce_hook", "TrainerMetrics", "FilePlanSource",
    "ConfigMapPlanSource", "epoch_order", "steps_per_epoch", "fetch", "load_checkpoint",
]


def init(global_batch_size=None, **kwargs) -> HeteroTrain:
    """Start heterotrain on this rank: joins (or starts, with Gloo) the
    default process group, serves ``/metrics``, and on rank 0 starts
    watching the plan source (``plan_file=`` / ``$HT_PLAN_FILE``, else the
    ConfigMap ``$HETEROTRAIN_PLAN_CONFIGMAP`` in ``$HETEROTRAIN_NAMESPACE``).
    Keyword arguments: see :class:`HeteroTrain`."""
    return HeteroTrain(global_batch_size, **kwargs)
