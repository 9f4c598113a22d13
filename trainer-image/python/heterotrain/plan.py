"""The batch plan: the JSON the operator writes into the plan ConfigMap (key
``plan.json``) or a plan file, and the rules a trainer accepts it by.

Wire format (camelCase keys)::

    {"generation": 3, "globalBatchSize": 32, "batchSizes": [20, 9, 3],
     "policy": "dynamic", "reason": "...",
     "predictedStepSeconds": 0.5, "predictedCommunicationSeconds": 0.1}

Invariants: one entry per rank; rank 0's local batch >= 1 (it always
trains), every other >= 0 (0 leaves that rank out of the plan); the sizes sum
to ``globalBatchSize``, which must be the job's global batch B; generations
only grow. A proposal breaking any of them is refused with a warning and a
counted rejection (``heterotrain_plan_rejected_total{reason}``), and
training goes on under the current plan.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import List, Optional

_U32 = 2**32 - 1
_U64 = 2**64 - 1


class PlanError(ValueError):
    """Why a plan was refused; ``label`` is the stable metric label."""

    def __init__(self, label: str, message: str):
        super().__init__(message)
        self.label = label


@dataclasses.dataclass
class BatchPlan:
    """One generation of the per-rank local batch sizes."""

    generation: int
    global_batch_size: int
    batch_sizes: List[int]
    policy: str = ""
    reason: str = ""
    predicted_step_seconds: Optional[float] = None
    predicted_communication_seconds: Optional[float] = None

    @staticmethod
    def equal(generation: int, global_batch: int, world_size: int) -> "BatchPlan":
        """An equal split; the first ``global_batch % world_size`` ranks get one more."""
        ws = max(world_size, 1)
        base, extra = divmod(global_batch, ws)
        return BatchPlan(
            generation=generation,
            global_batch_size=global_batch,
            batch_sizes=[base + (1 if r < extra else 0) for r in range(world_size)],
            policy="static",
            reason="equal split",
        )

    @staticmethod
    def from_json(text: str) -> "BatchPlan":
        """Parse plan JSON; a malformed text raises ``PlanError('parse', ...)``."""
        try:
            obj = json.loads(text)
        except (ValueError, TypeError) as e:
            raise PlanError("parse", f"plan is not valid JSON: {e}") from None
        if not isinstance(obj, dict):
            raise PlanError("parse", "plan is not valid JSON: not an object")

        def uint(key: str, top: int) -> int:
            if key not in obj:
                raise PlanError("parse", f"plan is not valid JSON: missing field `{key}`")
            v = obj[key]
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= top:
                raise PlanError("parse", f"plan is not valid JSON: `{key}` is not an unsigned integer")
            return v

        generation = uint("generation", _U64)
        global_batch = uint("globalBatchSize", _U32)
        sizes = obj.get("batchSizes")
        if not isinstance(sizes, list) or not all(
            isinstance(b, int) and not isinstance(b, bool) and 0 <= b <= _U32 for b in sizes
        ):
            raise PlanError("parse", "plan is not valid JSON: `batchSizes` is not a list of unsigned integers")

        def opt_str(key: str) -> str:
            v = obj.get(key, "")
            if v is None:
                return ""
            if not isinstance(v, str):
                raise PlanError("parse", f"plan is not valid JSON: `{key}` is not a string")
            return v

        def opt_float(key: str) -> Optional[float]:
            v = obj.get(key)
            if v is None:
                return None
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise PlanError("parse", f"plan is not valid JSON: `{key}` is not a number")
            return float(v)

        return BatchPlan(
            generation=generation,
            global_batch_size=global_batch,
            batch_sizes=list(sizes),
            policy=opt_str("policy"),
            reason=opt_str("reason"),
            predicted_step_seconds=opt_float("predictedStepSeconds"),
            predicted_communication_seconds=opt_float("predictedCommunicationSeconds"),
        )

    @staticmethod
    def parse(text: str, world_size: int) -> "BatchPlan":
        """Parse and validate a plan for a job with ``world_size`` ranks."""
        plan = BatchPlan.from_json(text)
        plan.validate(world_size)
        return plan

    def to_json(self) -> str:
        obj = {
            "generation": self.generation,
            "globalBatchSize": self.global_batch_size,
            "batchSizes": list(self.batch_sizes),
            "policy": self.policy,
            "reason": self.reason,
        }
        if self.predicted_step_seconds is not None:
            obj["predictedStepSeconds"] = self.predicted_step_seconds
        if self.predicted_communication_seconds is not None:
            obj["predictedCommunicationSeconds"] = self.predicted_communication_seconds
        return json.dumps(obj, separators=(",", ":"))

    def validate(self, world_size: int) -> None:
        """Raise ``PlanError`` unless: one entry per rank, rank 0's >= 1, sum = B."""
        if len(self.batch_sizes) != world_size:
            raise PlanError(
                "wrong_length",
                f"plan has {len(self.batch_sizes)} batch sizes but WORLD_SIZE is {world_size}",
            )
        if self.batch_sizes and self.batch_sizes[0] == 0:
            raise PlanError(
                "zero_batch",
                "plan gives rank 0 a local batch of 0; rank 0 must train "
                "(other ranks may get 0 to be left out)",
            )
        total = sum(self.batch_sizes)
        if total != self.global_batch_size:
            raise PlanError(
                "wrong_sum",
                f"plan batch sizes sum to {total} but globalBatchSize is {self.global_batch_size}",
            )

    def validate_for(self, world_size: int, global_batch: int) -> None:
        """Like ``validate``, and require the job's global batch."""
        self.validate(world_size)
        if self.global_batch_size != global_batch:
            raise PlanError(
                "global_mismatch",
                f"plan globalBatchSize is {self.global_batch_size} but this job trains with {global_batch}",
            )

    def offset_of(self, rank: int) -> int:
        """Index of the first sample of ``rank``'s slice within a global batch."""
        return sum(self.batch_sizes[:rank])

    def members(self) -> List[int]:
        """Ranks that train under this plan (local batch >= 1)."""
        return [r for r, b in enumerate(self.batch_sizes) if b > 0]


class PlanGate:
    """Rank 0's judge of proposals: accepts newer valid plans, counts the rest."""

    def __init__(self, on_reject=None):
        #: The current plan is the built-in equal split that nobody wrote: a
        #: proposal of the same generation may replace it.
        self.current_is_default = True
        self.rejected = 0
        self.last_error: Optional[str] = None
        self._on_reject = on_reject

    def _refuse(self, label: str, why: str, current: BatchPlan) -> None:
        print(
            f"warning: heterotrain: ignoring proposed plan, keeping generation "
            f"{current.generation}: {why}",
            file=sys.stderr,
            flush=True,
        )
        self.rejected += 1
        self.last_error = why
        if self._on_reject is not None:
            self._on_reject(label)
        return None

    def consider(self, text: str, current: BatchPlan, world_size: int) -> Optional[BatchPlan]:
        """The plan to switch to, or None (keep ``current``; a warning unless the
        proposal is just the current plan again)."""
        try:
            p = BatchPlan.from_json(text)
            p.validate_for(world_size, current.global_batch_size)
        except PlanError as e:
            return self._refuse(e.label, str(e), current)
        if p.generation == current.generation and p.batch_sizes == current.batch_sizes:
            return None
        newer = p.generation > current.generation or (
            self.current_is_default and p.generation == current.generation
        )
        if not newer:
            return self._refuse(
                "old_generation",
                f"generation {p.generation} is not newer than the current {current.generation}",
                current,
            )
        self.current_is_default = False
        return p
